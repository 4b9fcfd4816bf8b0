"""Ports on this machine for the servers the tests start, and whether one listens yet."""

from __future__ import annotations

import socket


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports no one listens on now (all held open together, then let go)."""
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [int(s.getsockname()[1]) for s in sockets]
    for s in sockets:
        s.close()
    return ports


def free_port() -> int:
    return free_ports(1)[0]


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts connections on ``host:port``."""
    with socket.socket() as sock:
        return sock.connect_ex((host, port)) == 0
