"""The group commit on its own (:mod:`duejobs.worker.group_commit`): what a batch carries and what
its
callers get back. Pure logic, in threads; the worker tests cover it over real PostgreSQL.

Seen failing against builds broken on purpose: the room left behind a caller's own requests
computed as ``limit + own`` → ``test_a_batch_never_carries_more_than_its_limit``; a failed
commit's error not handed to its requests, or its requests not marked answered (each caller
then ran its request again) →
``test_a_failed_commit_fails_every_request_it_carried_once_with_its_error``; an empty
submission taking the lead and never giving it back →
``test_an_empty_submission_is_answered_at_once_and_holds_up_no_one``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from duejobs.worker.group_commit import GroupCommit
from tests.support import wait_for


class _Blocking:
    """A batch runner whose first batch waits for ``release``; later ones fail with
    ``error`` when one is set. Records each batch."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.batches: list[list[str]] = []
        self.release = threading.Event()
        self.error = error

    def __call__(self, requests: Sequence[str]) -> list[str]:
        self.batches.append(list(requests))
        if len(self.batches) == 1:
            assert self.release.wait(30)
        elif self.error is not None:
            raise self.error
        return [r.upper() for r in requests]


def _behind_a_running_batch(
    commit: GroupCommit[str, str], runner: _Blocking, requests: list[str]
) -> dict[str, object]:
    """Each request submitted from a thread of its own while a first batch runs; their
    answers (or errors) by request once the first batch is released."""
    got: dict[str, object] = {}

    def submit(request: str) -> None:
        try:
            got[request] = commit.submit(request)
        except BaseException as exc:
            got[request] = exc

    first = threading.Thread(target=submit, args=("first",))
    first.start()
    wait_for(lambda: len(runner.batches) == 1, 10, "the first batch to run")
    threads = [threading.Thread(target=submit, args=(r,)) for r in requests]
    for t in threads:
        t.start()
    wait_for(lambda: len(commit._queue) == len(requests), 10, "the requests to queue")
    runner.release.set()
    for t in [first, *threads]:
        t.join(30)
    return got


def test_a_batch_never_carries_more_than_its_limit() -> None:
    runner = _Blocking()
    commit: GroupCommit[str, str] = GroupCommit("test", runner, limit=2)
    queued = [f"r{i}" for i in range(5)]
    got = _behind_a_running_batch(commit, runner, queued)
    assert got == {"first": "FIRST", **{r: r.upper() for r in queued}}
    assert max(len(b) for b in runner.batches) == 2
    assert sorted(r for b in runner.batches[1:] for r in b) == queued  # each carried once


def test_a_failed_commit_fails_every_request_it_carried_once_with_its_error() -> None:
    outage = ConnectionError("the database went away")
    runner = _Blocking(error=outage)
    commit: GroupCommit[str, str] = GroupCommit("test", runner, limit=8)
    got = _behind_a_running_batch(commit, runner, ["a", "b", "c"])
    assert got == {"first": "FIRST", "a": outage, "b": outage, "c": outage}
    assert len(runner.batches) == 2 and sorted(runner.batches[1]) == ["a", "b", "c"]  # run once


def test_an_empty_submission_is_answered_at_once_and_holds_up_no_one() -> None:
    """A caller with nothing to commit (jobs taken together none of which is a delivery) gets
    an empty answer, and the requests after it are still committed. Seen failing with the
    empty caller taking the lead and never giving it back (every later caller waited)."""
    commit: GroupCommit[str, str] = GroupCommit("test", lambda rs: [r.upper() for r in rs])
    assert commit.submit_all([]) == []
    got: list[str] = []
    after = threading.Thread(target=lambda: got.append(commit.submit("after")), daemon=True)
    after.start()
    after.join(10)
    assert got == ["AFTER"]
