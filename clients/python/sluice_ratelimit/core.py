"""What every client and middleware shares: the check a route asks for, the daemon's answer, and
the HTTP answer a middleware gives for it (the documented 429 and 503 bodies and headers)."""

import json
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple
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

#: `Retry-After` (seconds) of the 503 a fail-closed route answers when the sidecar is unreachable.
UNREACHABLE_RETRY_AFTER = 1
#: Default seconds between two log lines about decisions made without the sidecar.
DEFAULT_LOG_INTERVAL = 10.0


class SluiceError(Exception):
    """The daemon could not be asked: unreachable, too slow, or an answer that is not HTTP."""


class Check:
    """One route's question: descriptors, an optional policy, the cost, and what to do when the
    sidecar cannot be reached (`on_unreachable`: "open" serves the request, "closed" answers 503).
    """

    __slots__ = ("descriptors", "policy", "cost", "dry_run", "on_unreachable", "reserve")

    def __init__(self, descriptors: Mapping[str, str], policy: Optional[str] = None, cost: int = 1,
                 dry_run: bool = False, on_unreachable: str = OPEN, reserve: bool = False) -> None:
        if on_unreachable not in (OPEN, CLOSED):
            raise ValueError(f"on_unreachable is 'open' or 'closed', not {on_unreachable!r}")
        self.descriptors = dict(descriptors)
        self.policy = policy
        self.cost = cost
        self.dry_run = dry_run
        self.on_unreachable = on_unreachable
        #: Spend `cost` as an estimate and answer a `reservation` to settle (POST /v1/settle).
        self.reserve = reserve

    def body(self) -> Dict[str, Any]:
        """The JSON object of POST /v1/check."""
        body: Dict[str, Any] = {"descriptors": self.descriptors, "cost": self.cost,
                                "dry_run": self.dry_run}
        if self.policy:
            body["policy"] = self.policy
        if self.reserve:
            body["reserve"] = True
        return body


class Answer:
    """The daemon's answer: HTTP status, JSON body as a dict, and its rate-limit headers."""

    __slots__ = ("status", "body", "headers")

    def __init__(self, status: int, body: Dict[str, Any], headers: Sequence[Tuple[str, str]]) -> None:
        self.status = status
        self.body = body
        self.headers = {k.lower(): v for k, v in headers if k.lower() in RATE_LIMIT_HEADERS}

    @property
    def allowed(self) -> bool:
        """True on a 200 (allowed, including shadow and fail-open answers)."""
        return self.status == 200

    @property
    def permit(self) -> Optional[str]:
        """The permit an allowed check holds (a concurrency policy applied), to give back with
        `release` when the request ends; None when there is none."""
        permit = self.body.get("permit") if self.status == 200 else None
        return permit if isinstance(permit, str) and permit else None

    def __repr__(self) -> str:
        return f"Answer(status={self.status}, body={self.body!r})"


def decode(status: int, raw: bytes, headers: Sequence[Tuple[str, str]]) -> Answer:
    """An Answer from a status, the raw body and (name, value) header pairs."""
    try:
        body = json.loads(raw) if raw else {}
    except (ValueError, RecursionError) as error:  # RecursionError: JSON nested too deep
        raise SluiceError(f"the daemon's answer is not JSON: {error}") from None
    if not isinstance(body, dict):
        raise SluiceError("the daemon's answer is not a JSON object")
    return Answer(status, body, headers)


class Reply:
    """What a middleware does with a request: `status` None lets it through (adding `headers` to
    the application's answer); otherwise answer `status` with `headers` and the JSON `body`."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: Optional[int], headers: List[Tuple[str, str]], body: bytes = b"") -> None:
        self.status = status
        self.headers = headers
        self.body = body


def _json(status: int, headers: Sequence[Tuple[str, str]], value: Any) -> Reply:
    body = json.dumps(value, separators=(",", ":")).encode()
    headers = list(headers) + [("content-type", "application/json"), ("content-length", str(len(body)))]
    return Reply(status, headers, body)


#: The hook a middleware calls for every decision made without the sidecar: (check, error).
FallbackHook = Callable[[Check, SluiceError], None]
#: The hook that shapes a denial: (check, answer) -> a `Reply` of the application's own, or None
#: for the documented 429.
DenyHook = Callable[[Check, Answer], Optional[Reply]]


class SidecarWatch:
    """What a middleware does about a sidecar it cannot reach: calls `on_fallback(check, error)`
    for every decision made without it (wire it to the application's metrics), and logs one
    warning at most every `log_interval` seconds, with how many such decisions the interval saw."""

    def __init__(self, on_fallback: Optional[FallbackHook] = None,
                 log_interval: float = DEFAULT_LOG_INTERVAL) -> None:
        self.on_fallback = on_fallback
        self.log_interval = log_interval
        self._lock = threading.Lock()
        self._last_log: Optional[float] = None
        self._unlogged = 0
        #: Decisions made without the sidecar since this watch was made.
        self.count = 0

    def record(self, check: Check, error: SluiceError) -> None:
        """One decision made without the sidecar."""
        now = time.monotonic()
        with self._lock:
            self.count += 1
            self._unlogged += 1
            due = self._last_log is None or now - self._last_log >= self.log_interval
            if due:
                self._last_log, unlogged, self._unlogged = now, self._unlogged, 0
        if due:
            log.warning("sluice unreachable: %d decision(s) without the sidecar in the last %g s "
                        "(this one: %s): %s", unlogged, self.log_interval, check.on_unreachable, error)
        if self.on_fallback is not None:
            try:
                self.on_fallback(check, error)
            except Exception:  # noqa: BLE001 (a broken metrics hook never fails a request)
                log.exception("sluice: the on_fallback hook raised")


def reply_for(check: Check, answer: Optional[Answer] = None, error: Optional[SluiceError] = None,
              watch: Optional[SidecarWatch] = None, on_denied: Optional[DenyHook] = None) -> Reply:
    """The middleware's reply to `check` given the daemon's `answer`, or the `error` met asking.

    - 200: through, with the daemon's rate-limit headers;
    - 429: `{"error":"rate_limit","retry_after_sec":N}` with `Retry-After` and the rate-limit headers
      (or what `on_denied(check, answer)` returns, when it returns a `Reply`);
    - 503 (a fail-closed policy whose store is down): `{"error":"limiter_unavailable"}`;
    - unreachable or too slow: through ("open") or that 503 with `Retry-After: 1` ("closed"), per
      route; `watch` counts it and logs at most once per interval;
    - any other status (the daemon rejected the check: the route asks wrongly): 500
      `{"error":"limiter_rejected"}`, the daemon's reason logged, never an open door.
    """
    if error is not None or answer is None:
        failure = error if error is not None else SluiceError("no answer")
        (watch if watch is not None else _DEFAULT_WATCH).record(check, failure)
        if check.on_unreachable == OPEN:
            return Reply(None, [])
        return _json(503, [("retry-after", str(UNREACHABLE_RETRY_AFTER))],
                     {"error": "limiter_unavailable"})
    headers = list(answer.headers.items())
    if answer.status == 200:
        return Reply(None, headers)
    if answer.status == 429:
        if on_denied is not None:
            shaped = on_denied(check, answer)
            if shaped is not None:
                return shaped
        return _json(429, headers, {"error": "rate_limit",
                                    "retry_after_sec": answer.body.get("retry_after_sec", 0)})
    if answer.status == 503:
        return _json(503, headers, {"error": "limiter_unavailable"})
    log.error("sluice rejected the check (%s): %s: %s", answer.status,
              answer.body.get("error"), answer.body.get("reason"))
    return _json(500, [], {"error": "limiter_rejected"})


_DEFAULT_WATCH = SidecarWatch()


def parse_url(text: str) -> Tuple[str, int]:
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
