"""The view of an incoming request that a route function receives (the same for ASGI and WSGI)."""

#: Default bound on a body a route reads (a GraphQL query, a prompt), in bytes.
DEFAULT_MAX_BODY = 1 << 20


class BodyTooLarge(Exception):
    """The request's body exceeds the middleware's `max_body`: answered 413."""


class Request:
    """`method`, `path`, `query` (str), `headers` (lower-case names; the last of repeated ones),
    `client` (the peer's address, or None), `body` (bytes when the middleware read it, else None),
    and `raw` (the ASGI scope or the WSGI environ)."""

    __slots__ = ("method", "path", "query", "headers", "client", "body", "raw")

    def __init__(self, method, path, query, headers, client, raw, body=None):
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.client = client
        self.raw = raw
        self.body = body

    def __repr__(self):
        return f"Request({self.method} {self.path})"
