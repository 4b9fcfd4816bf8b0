"""``duejobs worker --processes P``: P worker processes kept running by one supervisor.

What it promises: P workers run, each ``duejobs worker`` with the same flags (the i-th with
``--metrics-port PORT+i``, and the name ``NAME-i`` — ``NAME-i.n`` on its n-th start, since
RQ refuses a name a killed worker left registered — when those are given), each in a session
of its own so that a terminal's Ctrl+C or a service manager's stop reaches it once, from
here. One that exits — killed, crashed, or ended by itself because its handlers would not
return (status 70) — is started again at once, or after a pause doubling from 1 s up to 30 s
while it keeps exiting within 10 s of its start (a worker that cannot start does not spin;
the others are looked after meanwhile). One that refuses to start (status 2: a password, the
schema, a flag — what no restart mends) stops them all, and the supervisor exits 2. The
first SIGTERM/SIGINT is passed to every worker — each takes no more jobs and finishes its
running ones — and the supervisor exits 0 once they all have (1 if one of them failed to
stop cleanly; one still starting, which the signal ends at once, held nothing and counts as
clean); a second one is passed on too, a cold shutdown for every worker. With ``--burst`` a
worker that ends cleanly is done, and the supervisor ends with the last one.

Its workers do not outlive it: on Linux each is asked (``PR_SET_PDEATHSIG``) to receive
SIGTERM — a warm shutdown — when the supervisor dies, even by SIGKILL, so no worker goes on
unsupervised.

With ``--cpus LIST`` the i-th worker is pinned to the i-th CPU of the list, round robin
(:func:`pin_to_cpu`): a worker's slots run Python on one core at a time (the GIL) but wake
each other's threads, and a wake-up across CPUs costs far more than one on the same CPU on
virtual machines (measured in docs/benchmarks.md); its other CPUs are left to PostgreSQL,
Redis and the other workers.

What it does not do: share anything between its workers (each has its own connections, slots,
heartbeat and metrics port), or restart itself — run it under compose, systemd or Kubernetes.
What a worker held when it died is rescued by the reconciler, as for any worker.

Why not RQ's ``WorkerPool``: it builds each worker from queue names alone, while a duejobs
worker is built around its App's handlers and its ``Runtime``; a child process running the
same command line keeps the worker's code path the single one.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType

from duejobs.errors import ConfigurationError
from duejobs.services.loop import StopRequest

log = logging.getLogger("duejobs.supervisor")

# What a worker ends with when it refuses to start on what no restart mends (a Redis refusing
# its password, a database without duejobs' tables, bad flags): the supervisor stops the
# others and ends with it, rather than starting it again for good.
EXIT_REFUSED = 2
# A worker that exits sooner than this after its start counts as failing to start.
_QUICK_EXIT = 10.0
_FIRST_PAUSE, _MAX_PAUSE = 1.0, 30.0
_POLL = 0.2


def allowed_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity mask: a container's cpuset, taskset)."""
    if not hasattr(os, "sched_getaffinity"):
        raise ConfigurationError("pinning a worker to a CPU needs Linux")
    return set(os.sched_getaffinity(0))


def pin_to_cpu(cpu: int) -> None:
    """Pin this process's main thread, and every thread it starts from now on (the worker's
    slots), to ``cpu``, which must be one it may run on."""
    allowed = allowed_cpus()
    if cpu not in allowed:
        raise ConfigurationError(
            f"CPU {cpu} is not one this process may run on ({sorted(allowed)})"
        )
    os.sched_setaffinity(0, {cpu})


def start_supervised(command: Sequence[str]) -> subprocess.Popen[bytes]:
    """Start one worker so that it ends with this process: a stop signal sent to it at any
    instant of its start ends it, and so does this process's death (Linux), even by SIGKILL.

    Between fork and exec the child runs with this process's Python signal handlers, whose
    flag dies with the exec: a SIGTERM landing there would be lost and the worker would run on
    unsupervised. So the stop signals are held back across the fork and given back to the
    child only once their default action (end the process) is restored."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        return subprocess.Popen(
            command,
            preexec_fn=functools.partial(_end_with_parent, os.getpid(), held),
            start_new_session=True,  # a terminal's or a unit's signal reaches it once, from here
        )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _end_with_parent(parent: int, mask: set[int | signal.Signals]) -> None:
    """In the child, before it runs: stop signals end it, the supervisor's death sends it
    SIGTERM (Linux), and so does a death that came before this was asked."""
    for signum in _STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a signal held meanwhile lands now
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
_PR_SET_PDEATHSIG = 1


@dataclass
class _Child:
    index: int
    process: subprocess.Popen[bytes] | None  # None: waiting out its pause before a restart
    started: float
    starts: int = 1
    pause: float = 0.0  # the last pause before a restart (doubles while it exits quickly)
    restart_at: float = 0.0


class Supervisor:
    """Runs ``args(i, n)`` — the ``duejobs`` command line of worker i's n-th start — for each
    i in ``range(processes)``."""

    def __init__(
        self, processes: int, args: Callable[[int, int], Sequence[str]], *, burst: bool = False
    ) -> None:
        self._processes = processes
        self._args = args
        self._burst = burst  # workers that end cleanly are done, not restarted
        self._children: dict[int, _Child] = {}
        self._stops = 0
        self._stopping = StopRequest()  # set by the signal handler
        self._refused = False  # a worker ended with EXIT_REFUSED: the supervisor ends so too

    def _launch(self, index: int, starts: int = 1, pause: float = 0.0) -> None:
        command = [sys.executable, "-m", "duejobs", *self._args(index, starts)]
        process = start_supervised(command)
        self._children[index] = _Child(index, process, time.monotonic(), starts, pause)
        log.info("worker %d started (pid %d)", index, process.pid)
        if self._stopping.is_set():  # a stop that came while it was being started
            process.send_signal(signal.SIGTERM)

    def _signal(self, signum: int, frame: FrameType | None) -> None:
        self._stops += 1
        self._stopping.set()
        log.warning(
            "%s: passed to %d workers (%s shutdown)",
            signal.Signals(signum).name,
            len(self._children),
            "warm" if self._stops == 1 else "cold",
        )
        for child in list(self._children.values()):
            if child.process is not None and child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)

    def _tend(self, child: _Child) -> bool:
        """Look after one worker: restart it when due; False once it is done (burst)."""
        now = time.monotonic()
        if child.process is None:
            if now >= child.restart_at:
                self._launch(child.index, child.starts + 1, child.pause)
            return True
        code = child.process.poll()
        if code is None:
            return True
        if self._burst and code == 0:
            return False
        if code == EXIT_REFUSED:  # what no restart mends (a password, the schema): said above
            log.error(
                "worker %d (pid %d) refused to start (status %d); the others are stopped",
                child.index,
                child.process.pid,
                code,
            )
            self._refused = True
            self._signal(signal.SIGTERM, None)
            return True
        quick = now - child.started < _QUICK_EXIT
        child.pause = min(_MAX_PAUSE, max(_FIRST_PAUSE, child.pause * 2)) if quick else 0.0
        log.warning(
            "worker %d (pid %d) exited with status %d; starting it again in %.0f s",
            child.index,
            child.process.pid,
            code,
            child.pause,
        )
        child.process, child.restart_at = None, now + child.pause
        return True

    def run(self) -> int:
        """Start the workers, keep them running until SIGTERM/SIGINT, then wait for them."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._signal)
        for index in range(self._processes):
            self._launch(index)
        while not self._stopping.wait(_POLL):
            working = [self._tend(child) for child in list(self._children.values())]
            if not any(working):
                break
        codes = [c.process.wait() for c in list(self._children.values()) if c.process is not None]
        if self._refused:
            return EXIT_REFUSED
        # A worker that the SIGTERM reached before it set up its handlers (still starting) held
        # nothing: it stopped cleanly too.
        return 0 if all(code in (0, -signal.SIGTERM) for code in codes) else 1
