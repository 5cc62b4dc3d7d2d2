"""A webhook receiver for the tests: records each POST, answers ``fail_first`` of them 500, then 200."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, fail_first: int = 0):
        self.fail_first = fail_first
        self.received: list[dict] = []  # each: headers, body, json, status answered
        self.handled: set[str] = set()  # Meridian-Delivery ids acted on (the receiver's idempotency check)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 -- http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status = 500 if len(owner.received) < owner.fail_first else 200
                owner.received.append({"headers": dict(self.headers), "body": body, "json": json.loads(body),
                                       "status": status})
                if status == 200:
                    owner.handled.add(self.headers["Meridian-Delivery"])
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else b"receiver down")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
