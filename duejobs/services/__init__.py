"""The maintenance services, beside the scheduler and the worker.

The periodic ones share one contract (:mod:`.loop`): a config dataclass checked when made,
``run_once()`` doing one pass and returning what it did, ``run()`` handing passes to the loop
that waits out a database or Redis outage, and ``stop()``:

* :mod:`.reconciler` — re-pushes overdue rows, rescues work whose worker died, removes
  orphan jobs, and creates the coming partitions;
* :mod:`.pruner` — deletes finished schedules and their history once old enough, and drops
  whole partitions behind.

The steps they and the operators' commands run:

* :mod:`.partition_maintenance` — partitions created ahead and dropped behind, and the
  online conversion to partitioned mode;
* :mod:`.node_drain` — one pass that moves a Redis node's jobs home once its queues moved."""
