"""WSGI middleware (Flask, Django, any WSGI server)."""

import io

from .client import Client
from .core import SluiceError, reply_for
from .request import DEFAULT_MAX_BODY, Request

_REASONS = {411: "Length Required", 413: "Payload Too Large", 429: "Too Many Requests", 500: "Internal Server Error",
            503: "Service Unavailable"}


class SluiceWSGI:
    """The WSGI twin of `SluiceASGI`, on a blocking `Client` shared by the server's threads:
    `route(request)` returns a `Check` or None; `read_body(request)` asks for the body (read up to
    `max_body` bytes, 413 beyond, and given back to the application as `wsgi.input`; a chunked
    body is read when the server ends its input, `wsgi.input_terminated`, else 411)."""

    def __init__(self, app, route, client=None, read_body=None, max_body=DEFAULT_MAX_BODY):
        self.app = app
        self.route = route
        self.client = client or Client()
        self.read_body = read_body
        self.max_body = max_body

    def __call__(self, environ, start_response):
        headers = {key[5:].replace("_", "-").lower(): value
                   for key, value in environ.items() if key.startswith("HTTP_")}
        for key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            if environ.get(key):
                headers[key.replace("_", "-").lower()] = environ[key]
        request = Request(environ.get("REQUEST_METHOD", "GET"), environ.get("PATH_INFO", "/") or "/",
                          environ.get("QUERY_STRING", ""), headers, environ.get("REMOTE_ADDR"), environ)
        if self.read_body and self.read_body(request):
            body = self._body(environ)
            if isinstance(body, int):
                error = b'{"error":"payload_too_large"}' if body == 413 else b'{"error":"length_required"}'
                return _answer(start_response, body, [("content-type", "application/json")], error)
            request.body = body
            environ["wsgi.input"] = io.BytesIO(request.body)
        check = self.route(request)
        if check is None:
            return self.app(environ, start_response)
        try:
            reply = reply_for(check, answer=self.client.check(check))
        except SluiceError as error:
            reply = reply_for(check, error=error)
        if reply.status is not None:
            return _answer(start_response, reply.status, reply.headers, reply.body)
        extra = [(k, v) for k, v in reply.headers if k != "retry-after"]

        def start_with_headers(status, response_headers, exc_info=None):
            return start_response(status, list(response_headers) + extra, exc_info)

        return self.app(environ, start_with_headers if extra else start_response)


    def _body(self, environ):
        """The request body, at most `max_body` bytes; else 413, or 411 for a chunked body the
        server does not end (`wsgi.input_terminated` unset: reading it could block or stop short,
        and a body read as empty would price the request as if it were)."""
        stream = environ["wsgi.input"]
        try:
            length = int(environ.get("CONTENT_LENGTH") or -1)
        except ValueError:
            length = -1
        if length >= 0:
            return 413 if length > self.max_body else stream.read(length)
        if environ.get("wsgi.input_terminated"):
            body = stream.read(self.max_body + 1)
            return 413 if len(body) > self.max_body else body
        if "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
            return 411
        return b""


def _answer(start_response, status, headers, body):
    start_response(f"{status} {_REASONS.get(status, '')}".strip(),
                   [(k, str(v)) for k, v in headers])
    return [body]
