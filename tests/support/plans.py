"""Reading PostgreSQL's EXPLAIN output: which index a plan reads, which tables it scans."""

from __future__ import annotations

import re


def reads_index(plan: str, index: str) -> bool:
    """Whether an EXPLAIN output reads ``index`` (``scheduled_jobs_claim_idx``): on the table,
    or in partitioned mode on a partition (``scheduled_jobs_p202612010000_claim_idx``)."""
    table = next(t for t in ("scheduled_jobs", "scheduled_job_events") if index.startswith(t))
    suffix = re.escape(index.removeprefix(table))
    return re.search(rf"\b{table}(?:_p\d{{12}}|_default)?{suffix}\b", plan) is not None


def full_scans(plan: str, tables: str = "scheduled_jobs") -> list[str]:
    """The sequential scans of an EXPLAIN output, on the tables whose names start with
    ``tables`` (their partitions included), that read a page or more: an empty partition's
    (costed below one page read) is no scan of the table."""
    found = []
    for line in plan.splitlines():
        cost = re.search(rf"Seq Scan on {tables}\w* .*cost=[\d.]+\.\.([\d.]+) ", line)
        if cost is not None and float(cost[1]) >= 1.0:
            found.append(line.strip())
    return found
