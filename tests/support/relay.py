"""A TCP relay that can turn into a blackhole: what a firewall forgetting a connection, a NAT
timeout or a pulled cable does to a database connection, on one machine.

While forwarding, it copies bytes both ways. Once :meth:`Relay.blackhole` is called, every
connection through it, and every new one, is kept open on both sides and nothing more crosses
it — no data, no reset, no close: each side sees a peer that went silent. (The bytes sent are
read and dropped, so the sender's kernel acknowledges them where a real blackhole would not;
the server's side, which is what the tests look at, is the same: a client gone silent.)
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from collections.abc import Iterator


class Relay:
    """Relays ``127.0.0.1:<port>`` to ``upstream`` — (host, port), or a Unix socket's path —
    in one thread of its own."""

    def __init__(self, upstream: tuple[str, int] | str) -> None:
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port = int(self._listener.getsockname()[1])
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._silent = threading.Event()
        self._closing = threading.Event()
        self._held: list[socket.socket] = []  # every socket, kept open until close()
        self._thread = threading.Thread(target=self._serve, name="relay", daemon=True)
        self._thread.start()

    def blackhole(self) -> None:
        """From now on nothing crosses, and nothing is closed."""
        self._silent.set()

    def close(self) -> None:
        self._closing.set()
        self._thread.join(timeout=5)
        for sock in (*self._held, self._listener):
            with contextlib.suppress(OSError):
                sock.close()
        self._selector.close()

    def _serve(self) -> None:
        while not self._closing.is_set():
            for key, _ in self._selector.select(timeout=0.1):
                if key.data is None:
                    self._accept()
                else:
                    self._pump(key.fileobj, key.data)  # type: ignore[arg-type]

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError):
            client, _ = self._listener.accept()
            self._held.append(client)
            if self._silent.is_set():  # a connection that never reaches the server
                self._selector.register(client, selectors.EVENT_READ, client)
                return
            if isinstance(self._upstream, str):
                server = socket.socket(socket.AF_UNIX)
                server.connect(self._upstream)
            else:
                server = socket.create_connection(self._upstream)
            self._held.append(server)
            for one, other in ((client, server), (server, client)):
                one.setblocking(False)
                self._selector.register(one, selectors.EVENT_READ, other)

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            data = source.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if self._silent.is_set():
            if not data:  # a close no one hears: stop watching, keep the other side open
                self._selector.unregister(source)
            return
        if not data:
            self._selector.unregister(source)
            with contextlib.suppress(OSError):
                target.shutdown(socket.SHUT_WR)
            return
        target.setblocking(True)
        with contextlib.suppress(OSError):
            target.sendall(data)
        target.setblocking(False)


@contextlib.contextmanager
def database_relay(database_url: str) -> Iterator[tuple[Relay, str]]:
    """A relay to the server of ``database_url`` (by TCP, or its Unix socket), and the URL
    that reaches that server through the relay."""
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    socket_dir = url.query.get("host")
    port = url.port or 5432
    if isinstance(socket_dir, str) and socket_dir.startswith("/"):
        relay = Relay(f"{socket_dir}/.s.PGSQL.{port}")
    else:
        relay = Relay((url.host or "127.0.0.1", port))
    through = url.difference_update_query(["host"]).set(host="127.0.0.1", port=relay.port)
    try:
        yield relay, through.render_as_string(hide_password=False)
    finally:
        relay.close()
