"""WSGI middleware (Flask, Django, any WSGI server)."""

import io
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from .client import Client
from .core import DEFAULT_LOG_INTERVAL, Check, DenyHook, FallbackHook, SidecarWatch, SluiceError, reply_for
from .request import DEFAULT_MAX_BODY, Request

Environ = Dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]

_REASONS = {411: "Length Required", 413: "Payload Too Large", 429: "Too Many Requests", 500: "Internal Server Error",
            503: "Service Unavailable"}


class SluiceWSGI:
    """The WSGI twin of `SluiceASGI`, on a blocking `Client` shared by the server's threads:
    `route(request)` returns a `Check` or None; `read_body(request)` asks for the body (read up to
    `max_body` bytes, 413 beyond, and given back to the application as `wsgi.input`; a chunked
    body is read when the server ends its input, `wsgi.input_terminated`, else 411);
    `on_fallback`, `log_interval` and `on_denied` as for `SluiceASGI`. `request.client` is
    `REMOTE_ADDR` (the socket peer under gunicorn, uWSGI, waitress, Werkzeug without ProxyFix)."""

    def __init__(self, app: WSGIApp, route: Callable[[Request], Optional[Check]],
                 client: Optional[Client] = None, read_body: Optional[Callable[[Request], bool]] = None,
                 max_body: int = DEFAULT_MAX_BODY, on_fallback: Optional[FallbackHook] = None,
                 log_interval: float = DEFAULT_LOG_INTERVAL, on_denied: Optional[DenyHook] = None) -> None:
        self.app = app
        self.route = route
        self.client = client or Client()
        self.read_body = read_body
        self.max_body = max_body
        self.watch = SidecarWatch(on_fallback, log_interval)
        self.on_denied = on_denied

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
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
            answer = self.client.check(check)
        except SluiceError as error:
            reply = reply_for(check, error=error, watch=self.watch)
        else:
            reply = reply_for(check, answer=answer, on_denied=self.on_denied)
        if reply.status is not None:
            return _answer(start_response, reply.status, reply.headers, reply.body)
        extra = [(k, v) for k, v in reply.headers if k != "retry-after"]

        def start_with_headers(status: str, response_headers: List[Tuple[str, str]],
                               exc_info: Any = None) -> Any:
            return start_response(status, list(response_headers) + extra, exc_info)

        return self.app(environ, start_with_headers if extra else start_response)

    def _body(self, environ: Environ) -> Union[bytes, int]:
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


def _answer(start_response: StartResponse, status: int, headers: List[Tuple[str, str]],
            body: bytes) -> List[bytes]:
    start_response(f"{status} {_REASONS.get(status, '')}".strip(),
                   [(k, str(v)) for k, v in headers])
    return [body]
