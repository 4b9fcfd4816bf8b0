"""The maintenance services, beside the scheduler and the worker.

Each is one kind of thing under one contract: a config dataclass checked when made (a
refusal names the knob), ``run_once()`` doing one pass and returning what it did; the periodic
ones add ``run()``, handing passes to the loop that waits out a database or Redis outage
(:mod:`.loop`), and ``stop()``:

* :mod:`.reconciler` — re-pushes overdue rows, rescues work whose worker died, removes
  orphan jobs, and creates the coming partitions;
* :mod:`.pruner` — deletes finished schedules and their history once old enough, and drops
  whole partitions behind;
* :mod:`.node_drain` — one pass, the operator's, that moves a Redis node's jobs home once
  its queues moved;
* :mod:`.stats` — not a service but what the operator reads of them all: the figures that
  ``duejobs stats``, the dashboard and the reconciler's gauges show.

The steps of partitioned mode, which the reconciler's and the pruner's passes run (their
results in theirs), and the online conversion to it: :mod:`.partition_maintenance`."""
