"""A reverse proxy for the tests, doing what the usual nginx ``location`` block does::

    location /duejobs/ {
        proxy_pass http://127.0.0.1:8080/;        # the prefix stripped
        proxy_set_header Host $host;               # with --forward-host only
        proxy_set_header X-Forwarded-For $remote_addr;
        proxy_set_header X-Forwarded-Proto $scheme;
    }

Run as ``python -c 'from tests.proxy import main; main()' LISTEN UPSTREAM PREFIX [--forward-host]``
(ports on 127.0.0.1). One request per connection; enough for pages and forms.
"""

from __future__ import annotations

import http.client
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Hop-by-hop headers a proxy does not pass on, and what it sets itself.
_DROPPED = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


def _handler(upstream: int, prefix: str, forward_host: bool) -> type[BaseHTTPRequestHandler]:
    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def _forward(self) -> None:
            path = self.path
            if prefix:
                if not (path == prefix or path.startswith(prefix + "/")):
                    self.send_error(404, "outside the proxied prefix")
                    return
                path = path[len(prefix) :] or "/"
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _DROPPED}
            headers["Host"] = (
                self.headers.get("host", "") if forward_host else f"127.0.0.1:{upstream}"
            )
            headers["X-Forwarded-For"] = self.client_address[0]
            headers["X-Forwarded-Proto"] = "http"
            headers["Content-Length"] = str(len(body))
            conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=30)
            try:
                conn.request(self.command, path, body=body, headers=headers)
                answer = conn.getresponse()
                payload = answer.read()
            finally:
                conn.close()
            self.send_response(answer.status, answer.reason)
            for name, value in answer.getheaders():
                if name.lower() not in _DROPPED:
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_HEAD = _forward

        def log_message(self, format: str, *args: object) -> None:
            sys.stdout.write(f"proxy: {format % args}\n")
            sys.stdout.flush()

    return Proxy


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    forward_host = "--forward-host" in args
    listen, upstream, prefix = [a for a in args if a != "--forward-host"]
    server = ThreadingHTTPServer(
        ("127.0.0.1", int(listen)), _handler(int(upstream), prefix.rstrip("/"), forward_host)
    )
    server.serve_forever()
