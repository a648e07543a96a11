"""WSGI middleware (Flask, Django, any WSGI server)."""

import io

from .client import Client
from .core import SluiceError, reply_for
from .request import DEFAULT_MAX_BODY, Request

_REASONS = {413: "Payload Too Large", 429: "Too Many Requests", 500: "Internal Server Error",
            503: "Service Unavailable"}


class SluiceWSGI:
    """The WSGI twin of `SluiceASGI`, on a blocking `Client` shared by the server's threads:
    `route(request)` returns a `Check` or None; `read_body(request)` asks for the body (read up to
    `max_body` bytes, 413 beyond, and given back to the application as `wsgi.input`)."""

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
            try:
                length = int(environ.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
            if length > self.max_body:
                return _answer(start_response, 413, [("content-type", "application/json")],
                               b'{"error":"payload_too_large"}')
            request.body = environ["wsgi.input"].read(length) if length > 0 else b""
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


def _answer(start_response, status, headers, body):
    start_response(f"{status} {_REASONS.get(status, '')}".strip(),
                   [(k, str(v)) for k, v in headers])
    return [body]
