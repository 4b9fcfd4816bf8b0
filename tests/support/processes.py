"""duejobs' commands in processes of their own, as a deployment runs them."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from pathlib import Path

# The checkout: the processes run from it, with it on their path.
ROOT = Path(__file__).resolve().parent.parent.parent
# A worker of the test handlers, and a scheduler that polls often.
WORKER = ["worker", "--app", "tests.support.apps:app", "--log-level", "warning"]
SCHEDULER = ["scheduler", "--poll-interval", "0.05", "--log-level", "warning"]


class Proc:
    """A duejobs command (or, with ``code``, a Python program) in its own process, its output
    in a file."""

    def __init__(
        self, args: list[str], env: dict[str, str], log: Path, code: str | None = None
    ) -> None:
        self.log = log
        argv = ["-c", code] if code is not None else ["-m", "duejobs", *args]
        with open(log, "w") as out:
            self.popen = subprocess.Popen(
                [sys.executable, *argv],
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: the cleanup ends its children too
            )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.send_signal(signal.SIGABRT)  # faulthandler: every thread's stack, logged
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=10)
            self.popen.kill()
            raise AssertionError(
                f"{self.popen.args} still running {timeout:g} s after signal {sig}:\n"
                + self.output()
            ) from None

    def ended(self, timeout: float = 30) -> int:
        """Its exit code once it ends by itself, within ``timeout`` seconds."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return self.stop(signal.SIGABRT, timeout=10)  # its stacks logged, then a failure

    def output(self) -> str:
        return self.log.read_text()


def stopped_at_first_line(args: list[str]) -> str:
    """A program that runs ``duejobs ARGS`` and sends itself SIGTERM as the service logs its
    first line ("duejobs <service>: ..."): the moment a deployment's stop can arrive, right
    after the start it saw."""
    return (
        "import logging, os, signal, sys\n"
        "made = logging.getLogRecordFactory()\n"
        "def record(*args, **kwargs):\n"
        "    made_record = made(*args, **kwargs)\n"
        "    if str(made_record.msg).startswith('duejobs %s: '):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return made_record\n"
        "logging.setLogRecordFactory(record)\n"
        f"sys.argv = ['duejobs', *{args!r}]\n"
        "from duejobs.cli import main\n"
        "main()\n"
    )
