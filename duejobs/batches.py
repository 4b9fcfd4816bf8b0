"""Group commit: the slots' claims and outcomes, many in one statement.

With several slots, deliveries arrive and handlers return at about the same moments. Each
slot hands its claim or its outcome to a :class:`GroupCommit` and waits for the answer. A
slot that finds no batch running runs one at once — its own request and every one queued
behind it (up to ``limit``) — in one statement on its own bookkeeping connection; the slots
that queued meanwhile wait for that commit, and the next of them runs the requests that
queued during it. An idle worker therefore pays no delay (a lone request is a batch of one),
and a busy one pays one round trip per batch instead of one per job.

What it promises: each request gets the answer of the one commit that carried it, or the
error that commit met; an answer is handed out only after the commit, so a slot acknowledges
a delivery to RQ only once its outcome is in the database. A commit that failed (an outage)
fails every request it carried, as each would have failed alone: the rows stay as they were
(``running`` until its lease ends, for the reconciler's rescue).

What it does not do: wait to fill a batch (no timer; under load batches fill by themselves),
or retry. Knob: ``limit``, the most requests one statement carries.

Metric: ``duejobs_worker_batch_size{kind}``, the requests each statement carried (its count is
the statements run, its sum the requests: their ratio is the round trips per request).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from duejobs import metrics

Request = TypeVar("Request")
Answer = TypeVar("Answer")


@dataclass
class _Pending(Generic[Request, Answer]):
    request: Request
    done: bool = False
    answer: Answer | None = None
    error: BaseException | None = field(default=None, repr=False)


class GroupCommit(Generic[Request, Answer]):
    """Requests from many threads, each batch run by one of them (see the module doc).

    ``run`` takes a batch of requests and returns their answers in the same order; it runs
    in the thread of whichever caller leads that batch."""

    def __init__(
        self, kind: str, run: Callable[[Sequence[Request]], Sequence[Answer]], limit: int = 64
    ) -> None:
        self._kind, self._run, self._limit = kind, run, limit
        self._queue: list[_Pending[Request, Answer]] = []
        self._running = False
        self._changed = threading.Condition()

    def submit(self, request: Request) -> Answer:
        """The answer to ``request``, once the statement that carried it has committed."""
        mine: _Pending[Request, Answer] = _Pending(request)
        with self._changed:
            self._queue.append(mine)
            while self._running and not mine.done:
                self._changed.wait()
            if not mine.done:  # no batch runs: lead one, this request first
                self._queue.remove(mine)
                batch = [mine, *self._queue[: self._limit - 1]]
                del self._queue[: self._limit - 1]
                self._running = True
                self._changed.release()
                try:
                    self._lead(batch)
                finally:
                    self._changed.acquire()
                    self._running = False
                    self._changed.notify_all()
        if mine.error is not None:
            raise mine.error
        return mine.answer  # type: ignore[return-value]

    def run_now(self, requests: Sequence[Request]) -> Sequence[Answer]:
        """Run ``requests`` as one batch in this thread (they arrived together), beside any
        batch another thread runs."""
        metrics.BATCH_SIZE.labels(self._kind).observe(len(requests))
        return self._run(requests)

    def _lead(self, batch: list[_Pending[Request, Answer]]) -> None:
        """Run one batch; every request in it is answered, whatever happens."""
        metrics.BATCH_SIZE.labels(self._kind).observe(len(batch))
        try:
            answers = self._run([p.request for p in batch])
        except BaseException as exc:  # the leader's own request is first: it raises this
            for pending in batch:
                pending.error, pending.done = exc, True
            return
        for pending, answer in zip(batch, answers, strict=True):
            pending.answer, pending.done = answer, True
