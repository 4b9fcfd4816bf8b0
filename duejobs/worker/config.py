"""The worker's knobs (:class:`WorkerConfig`), its outcomes and its exit status.

Each knob is stated once, here: its default, its bounds (checked when the config is built)
and its help text, from which ``duejobs worker``'s flags are made (one flag per field).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

from duejobs.errors import ConfigurationError
from duejobs.rq_wire.scripts import STUCK_AFTER
from duejobs.validation import check_count, check_duration

# The exit status of a worker that ended itself because handlers would not return.
EXIT_WEDGED = 70
# Slots per process: past this, more processes serve better than more threads.
MAX_CONCURRENCY = 512
# The longest take window: a free slot waiting longer for the others is a slot wasted.
_TAKE_WINDOW_MAX = timedelta(seconds=1)
# The longest switch interval: slots waiting longer for the GIL are slots wasted.
_SWITCH_INTERVAL_MAX = timedelta(seconds=1)
_MINUTE = timedelta(minutes=1)


def _knob(help: str, **bounds: Any) -> dict[str, Any]:
    """A field's metadata in :class:`WorkerConfig`: the help its flag shows, and its bounds
    (``zero_ok``, ``at_most`` for durations; ``low``, ``high`` for counts)."""
    return {"help": help, **bounds}


@dataclass(frozen=True)
class WorkerConfig:
    """Worker knobs (see :mod:`duejobs.worker` for what each one changes)."""

    lease: timedelta = field(
        default=timedelta(seconds=20), metadata=_knob("A running job's lease.")
    )
    heartbeat: timedelta = field(
        default=timedelta(seconds=5),
        metadata=_knob("Between renewals of the lease (at most a third of the lease)."),
    )
    max_early_wait: timedelta = field(
        default=timedelta(seconds=1),
        metadata=_knob(
            "How long a delivery that came early may wait for its time (by the database clock) "
            "instead of going back to the scheduled registry.",
            zero_ok=True,
            at_most=_MINUTE,
        ),
    )
    durable_bookkeeping: bool = field(
        default=False,
        metadata=_knob(
            "Wait for the disk on every claim and outcome (synchronous_commit on); off, a "
            "PostgreSQL crash can lose the last fraction of a second of them, and those "
            "schedules run again.",
        ),
    )
    timeout_grace: timedelta = field(
        default=timedelta(seconds=10),
        metadata=_knob(
            "How long a handler past its timeout may take to return before its slot is given up "
            f"(the worker exits with status {EXIT_WEDGED} for its supervisor once no slot works).",
        ),
    )
    claim_lock_timeout: timedelta = field(
        default=timedelta(seconds=2),
        metadata=_knob(
            "How long a claim waits for a row lock an application transaction holds before the "
            "delivery goes back for a second later.",
        ),
    )
    fence_idle_timeout: timedelta = field(
        default=timedelta(minutes=1),
        metadata=_knob(
            "How long the effect fence's transaction (ctx.transaction()) may sit idle between "
            "two statements before PostgreSQL ends its session and releases the row: the bound "
            "on a row held by a connection that vanished without a reset (a network blackhole). "
            "Set for that transaction alone.",
            at_most=timedelta(hours=1),
        ),
    )
    concurrency: int = field(
        default=1,
        metadata=_knob(
            "Deliveries run at once, each in a thread of its own (async handlers on the "
            "thread's event loop); 1 runs them in the main thread.",
            low=1,
            high=MAX_CONCURRENCY,
        ),
    )
    take_window: timedelta = field(
        default=timedelta(milliseconds=10),
        metadata=_knob(
            "With --concurrency above 1: how long a slot freed while others run waits for the "
            "handlers taken with its own (once per batch) before jobs are taken, so that they are "
            "taken, claimed and started together (0s: never).",
            zero_ok=True,
            at_most=_TAKE_WINDOW_MAX,
        ),
    )
    switch_interval: timedelta = field(
        default=timedelta(milliseconds=20),
        metadata=_knob(
            "With --concurrency above 1: the interpreter's switch interval while the worker works "
            "(how long a thread may hold the GIL while another waits for it; Python's is 5ms).",
            at_most=_SWITCH_INTERVAL_MAX,
        ),
    )
    unknown_type_grace: timedelta = field(
        default=timedelta(minutes=15),
        metadata=_knob(
            "How long a delivery of a type this worker has no handler for keeps being put "
            "back for a worker that has one (a rolling deploy) before it fails for good, "
            "naming its type.",
        ),
    )

    def __post_init__(self) -> None:
        for knob in fields(self):
            value, bounds = getattr(self, knob.name), knob.metadata
            if isinstance(knob.default, bool):
                if not isinstance(value, bool):
                    raise ConfigurationError(f"{knob.name} must be True or False, got {value!r}")
            elif isinstance(knob.default, timedelta):
                check_duration(
                    knob.name,
                    value,
                    zero_ok=bounds.get("zero_ok", False),
                    at_most=bounds.get("at_most"),
                )
            elif "low" in bounds:
                check_count(knob.name, value, bounds["low"], bounds["high"])
        if self.heartbeat * 3 > self.lease:
            raise ConfigurationError(
                f"heartbeat ({self.heartbeat}) must be at most a third of the lease "
                f"({self.lease}): a claim made ahead may wait up to a heartbeat before its "
                "handler starts, and the first renewal comes a heartbeat after that"
            )
        if self.claim_lock_timeout >= STUCK_AFTER:
            raise ConfigurationError(
                f"claim_lock_timeout must be shorter than {STUCK_AFTER.total_seconds():g} s"
            )


class Outcome(enum.StrEnum):
    """What handling one delivery came to."""

    SUCCEEDED = "succeeded"
    RETRYING = "retrying"
    INTERRUPTED = "interrupted"  # its connection broke: retried, its attempt not counted
    FAILED = "failed"
    SKIPPED = "skipped"
    DEFERRED = "deferred"
    STALE = "stale"
