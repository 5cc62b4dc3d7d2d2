"""What the local stand-ins for vendors' REST APIs (UFM, Storage Scale) share: a quiet handler of every verb."""

from http.server import BaseHTTPRequestHandler


class VerbHandler(BaseHTTPRequestHandler):
    """Sends GET, POST, PUT and DELETE to ``_serve(method)``; logs nothing (pytest shows failures, not requests)."""

    def log_message(self, format, *args):  # noqa: A002 -- the stdlib's signature
        pass

    def do_GET(self):
        self._serve("GET")

    def do_POST(self):
        self._serve("POST")

    def do_PUT(self):
        self._serve("PUT")

    def do_DELETE(self):
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        raise NotImplementedError
