"""Group commit: the slots' claims and outcomes, many in one statement, and their finishes in
RQ that no take carries (the worker waiting on an empty queue), many in one Redis script.

With several slots, deliveries arrive and handlers return at about the same moments. Each
slot hands its claim, its outcome or its RQ finish to a :class:`GroupCommit` and waits for the
answer (the worker hands over at once the claims of jobs it took from Redis together). A
caller that finds no batch running runs one at once — its own requests and those queued behind
them (up to ``limit``) — in one statement, on a connection it checks out for it; the callers
that queued meanwhile wait for that commit, and the caller of the request queued longest runs
the next batch. An idle worker therefore pays no delay (a lone request is a batch of one), and
a busy one pays one round trip per batch instead of one per job. A commit wakes only the
callers it answered and the next leader, however many slots wait.

What it promises: each request gets the answer of the one commit that carried it, or the
error that commit met; an answer is handed out only after the commit, so a slot acknowledges
a delivery to RQ only once its outcome is in the database. A commit that failed (an outage)
fails every request it carried, as each would have failed alone; each caller decides what to
do next (the worker records its outcomes again one by one: :mod:`duejobs.worker.closing`).

What it does not do: wait to fill a batch (no timer; under load batches fill by themselves),
or retry. Knob: ``limit``, the most requests one statement carries.

Metric: ``duejobs_worker_batch_size{kind}``, the requests each statement carried (its count is
the statements run, its sum the requests: their ratio is the round trips per request).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from duejobs.observability import metrics

Request = TypeVar("Request")
Answer = TypeVar("Answer")


@dataclass(eq=False)  # each caller is itself
class _Caller:
    """One call of :meth:`GroupCommit.submit_all`: woken (``wake``) when its requests are all
    answered or when it is to lead the next batch (``lead``) — never for another caller's
    batch, so a commit wakes the callers it answered and one more, however many wait."""

    wake: threading.Event = field(default_factory=threading.Event)
    lead: bool = False
    waiting: int = 0  # its requests not answered yet


@dataclass(eq=False)  # each request is itself, whatever it holds (two may be equal)
class _Pending(Generic[Request, Answer]):
    request: Request
    caller: _Caller
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
        self._lock = threading.Lock()

    def submit(self, request: Request) -> Answer:
        """The answer to ``request``, once the statement that carried it has committed."""
        return self.submit_all([request])[0]

    def submit_all(self, requests: Sequence[Request]) -> list[Answer]:
        """The answers to requests that arrived together, in their order, once committed
        (in one statement, with any queued behind them up to ``limit``)."""
        if not requests:
            return []
        caller = _Caller(waiting=len(requests))
        mine: list[_Pending[Request, Answer]] = [_Pending(r, caller) for r in requests]
        with self._lock:
            self._queue.extend(mine)
            if not self._running:  # no batch runs: lead one, these first
                self._running = caller.lead = True
                caller.wake.set()
        while True:
            caller.wake.wait()
            with self._lock:
                caller.wake.clear()
                if not caller.waiting:
                    break
                if not caller.lead:
                    continue
                caller.lead = False
                batch = self._take(mine)
            self._lead(batch)
        for pending in mine:
            if pending.error is not None:
                raise pending.error
        return [p.answer for p in mine]  # type: ignore[misc]

    def _take(self, mine: list[_Pending[Request, Answer]]) -> list[_Pending[Request, Answer]]:
        """The next batch, under the lock: the leader's own queued requests first, then those
        queued longest, up to ``limit``; taken off the queue."""
        own = [p for p in mine if not p.done]  # no batch runs: all of them are queued
        taken = {id(p) for p in own}
        others = [p for p in self._queue if id(p) not in taken]
        room = max(0, self._limit - len(own))
        batch, self._queue = own + others[:room], others[room:]
        return batch

    def _lead(self, batch: list[_Pending[Request, Answer]]) -> None:
        """Run one batch; every request in it is answered, whatever happens; then the callers
        it answered are woken, and the caller of the request queued longest leads next."""
        answers: Sequence[Answer | None]
        error: BaseException | None = None
        try:
            metrics.BATCH_SIZE.labels(self._kind).observe(len(batch))
            began = time.perf_counter()
            answers = self._run([p.request for p in batch])
            metrics.BATCH_SECONDS.labels(self._kind).observe(time.perf_counter() - began)
            if len(answers) != len(batch):
                raise RuntimeError(f"{len(answers)} answers to a batch of {len(batch)}")
        except BaseException as exc:  # each request's caller raises it, the leader's too
            answers, error = [None] * len(batch), exc
        with self._lock:
            for pending, answer in zip(batch, answers, strict=True):
                pending.answer, pending.error, pending.done = answer, error, True
                pending.caller.waiting -= 1
                if not pending.caller.waiting:
                    pending.caller.wake.set()
            if self._queue:
                following = self._queue[0].caller
                following.lead = True
                following.wake.set()
            else:
                self._running = False
