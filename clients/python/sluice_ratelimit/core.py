"""What every client and middleware shares: the check a route asks for, the daemon's answer, and
the HTTP answer a middleware gives for it (the documented 429 and 503 bodies and headers)."""

import json
import logging
from urllib.parse import urlsplit

log = logging.getLogger("sluice_ratelimit")

#: The rate-limit headers the daemon sets, copied onto the application's answers.
RATE_LIMIT_HEADERS = (
    "retry-after",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "ratelimit-policy",
    "ratelimit",
)

#: What a route may do when the sidecar cannot be reached (or does not answer in time).
OPEN, CLOSED = "open", "closed"

#: Longest answer body read from the daemon (its answers are a few hundred bytes).
MAX_ANSWER_BYTES = 1 << 20


class SluiceError(Exception):
    """The daemon could not be asked: unreachable, too slow, or an answer that is not HTTP."""


class Check:
    """One route's question: descriptors, an optional policy, the cost, and what to do when the
    sidecar cannot be reached (`on_unreachable`: "open" serves the request, "closed" answers 503).
    """

    __slots__ = ("descriptors", "policy", "cost", "dry_run", "on_unreachable")

    def __init__(self, descriptors, policy=None, cost=1, dry_run=False, on_unreachable=OPEN):
        if on_unreachable not in (OPEN, CLOSED):
            raise ValueError(f"on_unreachable is 'open' or 'closed', not {on_unreachable!r}")
        self.descriptors = dict(descriptors)
        self.policy = policy
        self.cost = cost
        self.dry_run = dry_run
        self.on_unreachable = on_unreachable

    def body(self):
        """The JSON object of POST /v1/check."""
        body = {"descriptors": self.descriptors, "cost": self.cost, "dry_run": self.dry_run}
        if self.policy:
            body["policy"] = self.policy
        return body


class Answer:
    """The daemon's answer: HTTP status, JSON body as a dict, and its rate-limit headers."""

    __slots__ = ("status", "body", "headers")

    def __init__(self, status, body, headers):
        self.status = status
        self.body = body
        self.headers = {k.lower(): v for k, v in headers if k.lower() in RATE_LIMIT_HEADERS}

    @property
    def allowed(self):
        """True on a 200 (allowed, including shadow and fail-open answers)."""
        return self.status == 200

    def __repr__(self):
        return f"Answer(status={self.status}, body={self.body!r})"


def decode(status, raw, headers):
    """An Answer from a status, the raw body and (name, value) header pairs."""
    try:
        body = json.loads(raw) if raw else {}
    except ValueError as error:
        raise SluiceError(f"the daemon's answer is not JSON: {error}") from None
    if not isinstance(body, dict):
        raise SluiceError("the daemon's answer is not a JSON object")
    return Answer(status, body, headers)


class Reply:
    """What a middleware does with a request: `status` None lets it through (adding `headers` to
    the application's answer); otherwise answer `status` with `headers` and the JSON `body`."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status, headers, body=b""):
        self.status = status
        self.headers = headers
        self.body = body


def _json(status, headers, value):
    body = json.dumps(value, separators=(",", ":")).encode()
    headers = list(headers) + [("content-type", "application/json"), ("content-length", str(len(body)))]
    return Reply(status, headers, body)


def reply_for(check, answer=None, error=None):
    """The middleware's reply to `check` given the daemon's `answer`, or the `error` met asking.

    - 200: through, with the daemon's rate-limit headers;
    - 429: `{"error":"rate_limit","retry_after_sec":N}` with `Retry-After` and the rate-limit headers;
    - 503 (a fail-closed policy whose store is down): `{"error":"limiter_unavailable"}`;
    - unreachable or too slow: through ("open") or that 503 ("closed"), per route;
    - any other status (the daemon rejected the check: the route asks wrongly): 500
      `{"error":"limiter_rejected"}`, the daemon's reason logged, never an open door.
    """
    if error is not None:
        log.warning("sluice unreachable (%s): %s", check.on_unreachable, error)
        if check.on_unreachable == OPEN:
            return Reply(None, [])
        return _json(503, [], {"error": "limiter_unavailable"})
    headers = list(answer.headers.items())
    if answer.status == 200:
        return Reply(None, headers)
    if answer.status == 429:
        return _json(429, headers, {"error": "rate_limit",
                                    "retry_after_sec": answer.body.get("retry_after_sec", 0)})
    if answer.status == 503:
        return _json(503, headers, {"error": "limiter_unavailable"})
    log.error("sluice rejected the check (%s): %s: %s", answer.status,
              answer.body.get("error"), answer.body.get("reason"))
    return _json(500, [], {"error": "limiter_rejected"})


def parse_url(text):
    """http://127.0.0.1:7070, 127.0.0.1:7070 or localhost:7070 -> (host, port); ValueError else."""
    url = text if "://" in text else "http://" + text
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if (parts.scheme != "http" or not parts.hostname or port is None
            or parts.path not in ("", "/") or parts.query or parts.fragment or "@" in parts.netloc):
        raise ValueError(f"{text!r} is not an address such as http://127.0.0.1:7070")
    return parts.hostname, port
