"""What prepared statements off (``DUEJOBS_PREPARED_STATEMENTS=off``, the setting for a pooler
that cannot keep them) costs the partitioned claim, the one statement duejobs prepares on
purpose.

One partitioned schema filled as ``bench.partitions`` fills it (PREP_ROWS, 1,000,000 finished
schedules over 30 days, partitions of 7 days), and before each claim PART_DUE (20,000)
schedules due now; then the scheduler's passes until they are all claimed and pushed, by an
App that prepares (``auto`` on a direct connection) and by one that does not, taking turns,
PREP_ROUNDS (5) rounds each. The figure: rows/s with preparing off beside with it on.

    python -m bench.prepared
"""

from __future__ import annotations

import os
import statistics

import redis
from sqlalchemy import text

from bench import partitions
from bench.common import Figure

partitions.ROWS = int(os.environ.get("PREP_ROWS", "1000000"))
ROUNDS = int(os.environ.get("PREP_ROUNDS", "5"))


def run(database_url: str, redis_url: str) -> list[Figure]:
    flush = redis.Redis.from_url(redis_url)
    prepared = partitions.make_app(database_url, redis_url, "parted", True)
    unprepared = partitions.make_app(
        database_url, redis_url, "parted", True, prepared_statements="off"
    )
    rates: dict[str, list[float]] = {"on": [], "off": []}
    try:
        partitions.fill(prepared, "parted", True)
        flush.flushdb()
        for round_ in range(ROUNDS):
            turns = [("on", prepared), ("off", unprepared)]
            for mode, app in turns if round_ % 2 == 0 else turns[::-1]:
                partitions.add_due(app, "parted", 2 * round_ + (mode == "off"))
                rates[mode].append(partitions.claim_rate(app))
                flush.flushdb()
            print(
                f"  claim round {round_ + 1}: prepared {rates['on'][-1]:,.0f}/s, "
                f"not prepared {rates['off'][-1]:,.0f}/s",
                flush=True,
            )
    finally:
        with prepared.engine.begin() as conn:
            conn.execute(text("DROP SCHEMA parted CASCADE"))
        prepared.close()
        unprepared.close()
        flush.flushdb()
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    return [
        Figure(
            f"partitioned claim, prepared statements off, {partitions.ROWS:,} rows (on beside)",
            off,
            on,
            "rows/s",
            "measured: what a pooler that keeps none costs",
            True,
        )
    ]


if __name__ == "__main__":
    from bench.common import scratch_database

    with scratch_database() as (url, redis_url):
        for figure in run(url, redis_url):
            print(figure.line(), flush=True)
