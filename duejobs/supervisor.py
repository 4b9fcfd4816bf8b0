"""``duejobs worker --processes P``: P worker processes kept running by one supervisor.

What it promises: P workers run, each ``duejobs worker`` with the same flags (the i-th with
``--metrics-port PORT+i`` and the name ``NAME-i`` when those are given). One that exits —
killed, crashed, or ended by itself because its handlers would not return (status 70) — is
started again at once, or after a pause doubling from 1 s up to 30 s while it keeps exiting
within 10 s of its start (a worker that cannot start does not spin). The first SIGTERM/SIGINT
is passed to every worker — each takes no more jobs and finishes its running ones — and the
supervisor exits 0 once they all have (1 if one of them failed to stop cleanly; one still
starting, which the signal ends at once, held nothing and counts as clean); a second one
is passed on too, a cold shutdown for every worker. With ``--burst`` a worker that ends
cleanly is done, and the supervisor ends with the last one.

Its workers do not outlive it: on Linux each is asked (``PR_SET_PDEATHSIG``) to receive
SIGTERM — a warm shutdown — when the supervisor dies, even by SIGKILL, so no worker goes on
unsupervised.

What it does not do: share anything between its workers (each has its own connections, slots,
heartbeat and metrics port), or restart itself — run it under compose, systemd or Kubernetes.
What a worker held when it died is rescued by the reconciler, as for any worker.

Why not RQ's ``WorkerPool``: it builds each worker from queue names alone, while a duejobs
worker is built around its App's handlers and its ``Runtime``; a child process running the
same command line keeps the worker's code path the single one.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType

log = logging.getLogger("duejobs.supervisor")

# A worker that exits sooner than this after its start counts as failing to start.
_QUICK_EXIT = 10.0
_FIRST_PAUSE, _MAX_PAUSE = 1.0, 30.0
_POLL = 0.2


def _end_with_parent() -> None:
    """In the child, before it runs: SIGTERM when the supervisor dies (Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_PR_SET_PDEATHSIG = 1


@dataclass
class _Child:
    index: int
    process: subprocess.Popen[bytes]
    started: float
    pause: float = 0.0  # before the next restart, if this one exits quickly


class Supervisor:
    """Runs ``args(i)`` (a ``duejobs`` command line) for each i in ``range(processes)``."""

    def __init__(self, args: Sequence[Sequence[str]], *, burst: bool = False) -> None:
        self._args = [list(a) for a in args]
        self._burst = burst  # workers that end cleanly are done, not restarted
        self._children: list[_Child] = []
        self._stops = 0
        self._stopping = threading.Event()

    def _start(self, index: int, pause: float = 0.0) -> _Child:
        command = [sys.executable, "-m", "duejobs", *self._args[index]]
        process = subprocess.Popen(command, preexec_fn=_end_with_parent)
        child = _Child(index, process, time.monotonic(), pause)
        log.info("worker %d started (pid %d)", index, child.process.pid)
        return child

    def _signal(self, signum: int, frame: FrameType | None) -> None:
        self._stops += 1
        self._stopping.set()
        log.warning(
            "%s: passed to %d workers (%s shutdown)",
            signal.Signals(signum).name,
            len(self._children),
            "warm" if self._stops == 1 else "cold",
        )
        for child in self._children:
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)

    def run(self) -> int:
        """Start the workers, keep them running until SIGTERM/SIGINT, then wait for them."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._signal)
        self._children = [self._start(i) for i in range(len(self._args))]
        while not self._stopping.wait(_POLL):
            codes = [child.process.poll() for child in self._children]
            if self._burst and all(code == 0 for code in codes):
                break
            for n, (child, code) in enumerate(zip(self._children, codes, strict=True)):
                if code is None or (self._burst and code == 0) or self._stopping.is_set():
                    continue
                quick = time.monotonic() - child.started < _QUICK_EXIT
                pause = min(_MAX_PAUSE, max(_FIRST_PAUSE, child.pause * 2)) if quick else 0.0
                log.warning(
                    "worker %d (pid %d) exited with status %d; starting it again in %.0f s",
                    child.index,
                    child.process.pid,
                    code,
                    pause,
                )
                if self._stopping.wait(pause):
                    break
                self._children[n] = self._start(child.index, pause)
        codes = [child.process.wait() for child in self._children]
        # A worker that the SIGTERM reached before it set up its handlers (still starting) held
        # nothing: it stopped cleanly too.
        return 0 if all(code in (0, -signal.SIGTERM) for code in codes) else 1
