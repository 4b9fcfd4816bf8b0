"""Schedule ids: UUID version 7 (RFC 9562), which grow with time. (A delivery's RQ job id,
built from one, is read in :mod:`duejobs.rq_wire.job_ids`.)

A schedule's id leads the primary key of ``scheduled_jobs`` and of its history. Random
(version 4) ids put each insert on a random leaf page of both indexes; ids that grow with
time put it at the right edge, where the pages are already in memory. Measured here
(``bench/bulk.py``'s rows): PostgreSQL spends about a third less CPU taking in 100,000
schedules and their events, and as the table grows to millions of rows the primary key's
hot pages stay a few instead of all of them.

Layout: 48 bits of Unix time in milliseconds, the version (7), 12 bits, the variant (10),
62 random bits. The 12 bits count up within a block of ids drawn together (random for a
single id), so a bulk insert's ids are in order.

What an id promises: unique (62 random bits per millisecond and counter), ordered by the
drawing process's clock to the millisecond, and a bulk insert's ids in increasing order.
What it does not: order between processes, or between single ids, within a millisecond;
and it tells anyone who sees it when it was made (as ``created_at`` does). Only the last 62
bits are random: :func:`random_share` reads those.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

_RANDOM_BITS = 62
_RANDOM = (1 << _RANDOM_BITS) - 1
_FIXED = 0x7 << 76 | 0b10 << 62  # version and variant, in an id read as a 128-bit integer
_BLOCK = 1024  # ids drawn together: the counter has 12 bits, so at most 4,096
# A block as one big integer, id 0 in its top 128 bits: these repeat a field in every id.
_EACH = sum(1 << 128 * k for k in range(_BLOCK))
_RANDOM_IN_EACH = _RANDOM * _EACH
_COUNTERS = sum(i << 64 << 128 * (_BLOCK - 1 - i) for i in range(_BLOCK))


def new_id() -> uuid.UUID:
    """One id for a schedule created on its own."""
    drawn = int.from_bytes(os.urandom(10))  # 12 bits for the counter's place, 62 at the end
    counter = (drawn >> _RANDOM_BITS & 0xFFF) << 64
    return uuid.UUID(int=time.time_ns() // 1_000_000 << 80 | _FIXED | counter | drawn & _RANDOM)


def id_stream() -> Iterator[bytes]:
    """Ids for a bulk insert, each as its 16 bytes (the uuid's binary form), in increasing
    order: a block drawn in the same millisecond as the one before takes the next one.
    Drawn 1,024 at a time: one read of os.urandom and a few big-integer operations."""
    last = 0
    while True:
        last = max(last + 1, time.time_ns() // 1_000_000)
        head = (last << 80 | _FIXED) * _EACH
        drawn = int.from_bytes(os.urandom(16 * _BLOCK)) & _RANDOM_IN_EACH
        block = (head | _COUNTERS | drawn).to_bytes(16 * _BLOCK)
        for start in range(0, len(block), 16):
            yield block[start : start + 16]


def random_share(schedule_id: uuid.UUID) -> float:
    """A number in [0, 1) fixed by the id's random bits."""
    return (schedule_id.int & _RANDOM) / (1 << _RANDOM_BITS)


def _millis(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def first_id_at(at: datetime) -> uuid.UUID:
    """The lowest id of the millisecond ``at``: ids drawn from then on sort at or after it
    (a partition's bound, see :mod:`duejobs.services.partition_maintenance`)."""
    return uuid.UUID(int=_millis(at) << 80)


def stamped(derived: uuid.UUID, at: datetime) -> uuid.UUID:
    """A deterministic id that still sorts by time: ``derived``'s last 76 bits (its variant
    and 74 bits of its hash) behind the millisecond ``at`` and version 8 (RFC 9562's custom
    version). A recurring occurrence's id is derived from its definition and instant, so two
    schedulers make the same one; stamped with the instant, it lands beside the ids of its
    time (at the right edge of the primary key, in the partition of its time)."""
    return uuid.UUID(int=_millis(at) << 80 | 0x8 << 76 | derived.int & (1 << 76) - 1)


def time_of(schedule_id: uuid.UUID) -> datetime:
    """The millisecond an id was stamped with (its creation, for a version 7 id)."""
    return datetime.fromtimestamp((schedule_id.int >> 80) / 1000, tz=UTC)
