"""sluice-ratelimit: a client of the sluice rate-limit sidecar (Unix socket or TCP, kept-alive
connections, one deadline per call), ASGI and WSGI middleware answering the documented 429 and
503, and the client's real address behind proxies. Standard library only."""

from .address import TrustedProxies
from .asgi import SluiceASGI
from .client import AsyncClient, Client
from .core import CLOSED, OPEN, Answer, Check, Reply, SidecarWatch, SluiceError
from .request import Request
from .reserve import SluiceReserveASGI, Usage
from .wsgi import SluiceWSGI

__all__ = ["Answer", "AsyncClient", "Check", "Client", "CLOSED", "OPEN", "Reply", "Request",
           "SidecarWatch", "SluiceASGI", "SluiceError", "SluiceReserveASGI", "SluiceWSGI",
           "TrustedProxies", "Usage"]
__version__ = "0.1.0"
