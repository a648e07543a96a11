"""The view of an incoming request that a route function receives (the same for ASGI and WSGI)."""

from typing import Any, Dict, Optional

from .address import TrustedProxies

#: Default bound on a body a route reads (a GraphQL query, a prompt), in bytes.
DEFAULT_MAX_BODY = 1 << 20

_TRUST_NOTHING = TrustedProxies()


class BodyTooLarge(Exception):
    """The request's body exceeds the middleware's `max_body`: answered 413."""


class Request:
    """`method`, `path`, `query` (str), `headers` (lower-case names; repeated ones joined with
    commas, in order), `client` (the socket peer's address as the server reports it, or None),
    `body` (bytes when the middleware read it, else None), and `raw` (the ASGI scope or the WSGI
    environ). The client's real address behind proxies: `client_address(proxies)`."""

    __slots__ = ("method", "path", "query", "headers", "client", "body", "raw")

    def __init__(self, method: str, path: str, query: str, headers: Dict[str, str],
                 client: Optional[str], raw: Any, body: Optional[bytes] = None) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.client = client
        self.raw = raw
        self.body = body

    def client_address(self, proxies: Optional[TrustedProxies] = None) -> Optional[str]:
        """The client's address: `client` unless it is one of `proxies`, then the first address
        from the right of the proxies' header that none of them vouches for (see
        `TrustedProxies`); without `proxies`, `client` as an address."""
        return (proxies or _TRUST_NOTHING).client_address(self.client, self.headers)

    def __repr__(self) -> str:
        return f"Request({self.method} {self.path})"
