"""How many reads of one page the dashboard runs at once.

A page's read waits for what holds it up — a lock a migration or ``VACUUM FULL`` takes on a
table it reads (up to four fifths of the App's ``read_timeout``), a slow database — and holds
a thread and a connection of the App's pool meanwhile. Unbounded, a page held up fills the
pool, and every other page waits behind it though it reads nothing locked. So each page runs
at most ``PAGE_READS`` reads at a time, and a request past them is answered 503 at once (with
``Retry-After``), saying why: the other pages keep the rest of the pool. What it does not
bound: the pages' reads together (the pool does), nor the stylesheet, which reads nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response

# Reads of one page at a time: with four pages that read, 12 of the pool's 15 connections at
# most, the rest left to the actions.
PAGE_READS = 3


def one_page_at_most(
    page: Callable[[Request], Response], most: int = PAGE_READS
) -> Callable[[Request], Response]:
    """``page`` (a page's method, run on a thread of its own) with at most ``most`` of its
    reads at a time; a request past them is answered 503 at once."""
    slots = threading.BoundedSemaphore(most)

    def read(request: Request) -> Response:
        if not slots.acquire(blocking=False):
            return Response(
                f"{most} reads of this page are under way and held up (a lock on a table it "
                "reads, or a slow database): try again in a moment",
                status_code=503,
                headers={"Retry-After": "5"},
            )
        try:
            return page(request)
        finally:
            slots.release()

    return read
