"""WSGI middleware (Flask, Django, any WSGI server)."""

import io
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from .client import Client
from .core import DEFAULT_LOG_INTERVAL, Check, DenyHook, FallbackHook, SidecarWatch, SluiceError, reply_for
from .permits import Permit
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
    `REMOTE_ADDR` (the socket peer under gunicorn, uWSGI, waitress, Werkzeug without ProxyFix).

    An allowed answer's `permit` (a concurrency policy) is released exactly once: when the
    application raises before answering, or when the server closes the answer (PEP 3333: sent
    whole, or ended by an error such as a write to a client gone; a timeout in WSGI is an
    exception of the application's). A failed release is logged, never raised."""

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
        permit = None
        try:
            answer = self.client.check(check)
        except SluiceError as error:
            reply = reply_for(check, error=error, watch=self.watch)
        else:
            reply = reply_for(check, answer=answer, on_denied=self.on_denied)
            permit = answer.permit
        if reply.status is not None:
            return _answer(start_response, reply.status, reply.headers, reply.body)
        extra = [(k, v) for k, v in reply.headers if k != "retry-after"]

        def start_with_headers(status: str, response_headers: List[Tuple[str, str]],
                               exc_info: Any = None) -> Any:
            return start_response(status, list(response_headers) + extra, exc_info)

        if permit is None:
            return self.app(environ, start_with_headers if extra else start_response)
        held = Permit(self.client, permit)
        try:
            iterable = self.app(environ, start_with_headers if extra else start_response)
        except BaseException:
            held.release()
            raise
        return _Releasing(iterable, held)

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


class _Releasing:
    """The application's answer, passed through; the permit is released when the server closes
    it, which PEP 3333 has it do however the answer ends: sent whole, failed while iterating
    (the application raised, a write to a client gone failed). A failed release is logged."""

    def __init__(self, body: Iterable[bytes], held: Permit) -> None:
        self._body = body
        self._held = held

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            self._held.release()


def _answer(start_response: StartResponse, status: int, headers: List[Tuple[str, str]],
            body: bytes) -> List[bytes]:
    start_response(f"{status} {_REASONS.get(status, '')}".strip(),
                   [(k, str(v)) for k, v in headers])
    return [body]
