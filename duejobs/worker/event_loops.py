"""Each slot's event loop, on which its ``async def`` handlers run.

An event loop is made on a slot's first ``async def`` handler and kept for its next. What it
promises: :class:`EventLoops` runs an ``async def`` handler to completion, cancels it at its
timeout when given one, and leaves no task of an attempt running into the next (a task that
refuses its cancellation is dropped with its loop, and the slot gets a new one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable
from datetime import timedelta
from typing import Any

from duejobs.errors import HandlerTimeoutError

log = logging.getLogger("duejobs.worker")


class EventLoops:
    """One event loop per slot, on which its ``async def`` handlers run."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._all: list[asyncio.AbstractEventLoop] = []
        self._lock = threading.Lock()

    def _loop(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop | None = getattr(self._local, "loop", None)
        if loop is None:
            loop = self._local.loop = asyncio.new_event_loop()
            with self._lock:
                self._all.append(loop)
        return loop

    def run(self, awaitable: Awaitable[Any], timeout: timedelta | None = None) -> None:
        """Run ``awaitable`` to completion on this slot's loop — never a success without a
        run. With ``timeout``, it is cancelled then and :class:`HandlerTimeoutError` raised
        (a ``TimeoutError`` of the handler's own stays what it is)."""
        loop = self._loop()
        task = loop.create_task(_bounded(awaitable, timeout))
        try:
            loop.run_until_complete(task)
        finally:
            # Nothing of this attempt may run on into the next one: the handler's task if
            # a timeout struck, and any task it left behind.
            # (asyncio.all_tasks reads every task of the process: once when none is left.)
            leftover = asyncio.all_tasks(loop)
            if leftover:
                for pending in leftover:
                    pending.cancel()
                with contextlib.suppress(BaseException):
                    loop.run_until_complete(asyncio.wait(leftover, timeout=1))
                # A task that swallowed its cancellation, or one made while the others were
                # cancelled, must not run into the next attempt either.
                if any(not t.done() for t in asyncio.all_tasks(loop)):
                    self._discard(loop)

    def _discard(self, loop: asyncio.AbstractEventLoop) -> None:
        """A task of the attempt swallowed its cancellation: the loop it waits on is closed
        and the slot's next handler gets a new one, so the task never runs again (Python
        warns that it was destroyed pending)."""
        stubborn = [t for t in asyncio.all_tasks(loop) if not t.done()]
        log.warning(
            "%d task(s) left by a handler would not be cancelled: %s; dropped with their loop",
            len(stubborn),
            ", ".join(t.get_name() for t in stubborn),
        )
        self._local.loop = None
        with self._lock:
            self._all.remove(loop)
        loop.close()

    def close(self) -> None:
        with self._lock:
            loops, self._all = self._all, []
        for loop in loops:
            loop.close()


async def _bounded(awaitable: Awaitable[Any], timeout: timedelta | None) -> None:
    if timeout is None:
        await awaitable
        return
    scope = asyncio.timeout(timeout.total_seconds())
    try:
        async with scope:
            await awaitable
    except TimeoutError as exc:
        if scope.expired():
            raise HandlerTimeoutError(
                f"handler ran past its timeout of {timeout.total_seconds():g} s"
            ) from exc
        raise
