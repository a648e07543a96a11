package sluice

import (
	"errors"
	"log"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// UnreachableRetryAfter is the Retry-After (seconds) of the 503 a FailClosed route answers when
// the sidecar cannot be reached.
const UnreachableRetryAfter = "1"

// DefaultLogInterval is the least time between two log lines about decisions made without the
// sidecar.
const DefaultLogInterval = 10 * time.Second

// Unreachable says what a route does when the sidecar cannot be reached or does not answer in
// time.
type Unreachable int

const (
	// FailOpen serves the request (the default).
	FailOpen Unreachable = iota
	// FailClosed answers 503 {"error":"limiter_unavailable"}.
	FailClosed
)

// RouteCheck is what a route asks: the check (its Cost taken from the request: a GraphQL query's,
// tokens) and what to do when the sidecar cannot be reached.
type RouteCheck struct {
	Check
	OnUnreachable Unreachable
	// Refuse, when not 0, is a status the middleware answers at once with no check: 413
	// {"error":"payload_too_large"} for a body over its bound (ReadBody's ErrBodyTooLarge),
	// else {"error":"refused"}.
	Refuse int
}

// Route picks the check for a request, or nil when the request is not limited. It may read the
// body (for a cost) if it puts back one the handler can read (see ReadBody).
type Route func(r *http.Request) *RouteCheck

// Reply is what the middleware does for a check: Status 0 lets the request through (with Headers
// added to the handler's answer); otherwise it answers Status with Headers and the JSON Body.
type Reply struct {
	Status  int
	Headers http.Header
	Body    []byte
}

// ReplyFor is the reply to check given the daemon's answer, or the error met asking:
//   - 200: through, with the daemon's rate-limit headers;
//   - 429: {"error":"rate_limit","retry_after_sec":N} with Retry-After and the rate-limit headers;
//   - 503 (a fail-closed policy whose store is down): {"error":"limiter_unavailable"};
//   - unreachable or too slow: through (FailOpen) or that 503 with Retry-After: 1 (FailClosed),
//     per route;
//   - any other status (the daemon rejected the check: the route asks wrongly): 500
//     {"error":"limiter_rejected"}, the daemon's reason logged, never an open door.
func ReplyFor(check *RouteCheck, answer Answer, err error, logger *log.Logger) Reply {
	if err != nil {
		var unreachable *Error
		if !errors.As(err, &unreachable) {
			logger.Printf("sluice: %v", err)
			return jsonReply(http.StatusInternalServerError, nil, `{"error":"limiter_rejected"}`)
		}
		if check.OnUnreachable == FailOpen {
			return Reply{Headers: http.Header{}}
		}
		return jsonReply(http.StatusServiceUnavailable, http.Header{"Retry-After": {UnreachableRetryAfter}},
			`{"error":"limiter_unavailable"}`)
	}
	switch answer.Status {
	case http.StatusOK:
		return Reply{Headers: answer.Headers}
	case http.StatusTooManyRequests:
		body := `{"error":"rate_limit","retry_after_sec":` + strconv.FormatUint(answer.Result.RetryAfterSec, 10) + `}`
		return jsonReply(http.StatusTooManyRequests, answer.Headers, body)
	case http.StatusServiceUnavailable:
		return jsonReply(http.StatusServiceUnavailable, answer.Headers, `{"error":"limiter_unavailable"}`)
	}
	logger.Printf("sluice rejected the check (%d): %s: %s", answer.Status, answer.Result.Error, answer.Result.Reason)
	return jsonReply(http.StatusInternalServerError, nil, `{"error":"limiter_rejected"}`)
}

func jsonReply(status int, headers http.Header, body string) Reply {
	out := http.Header{}
	for name, values := range headers {
		out[name] = values
	}
	out.Set("Content-Type", "application/json")
	out.Set("Content-Length", strconv.Itoa(len(body)))
	return Reply{Status: status, Headers: out, Body: []byte(body)}
}

// MiddlewareOptions are the middleware's hooks.
type MiddlewareOptions struct {
	// Logger receives the middleware's lines; nil: log's default.
	Logger *log.Logger
	// OnFallback is called for every decision made without the sidecar (unreachable, too slow,
	// an unreadable answer): wire it to the application's metrics.
	OnFallback func(check *RouteCheck, err error)
	// LogInterval is the least time between two log lines about such decisions (with how many
	// the interval saw); DefaultLogInterval when 0.
	LogInterval time.Duration
	// OnDenied may answer a denial the application's own way (a JSON:API error, an HTML page):
	// a Reply with a Status, or a zero Reply for the documented 429.
	OnDenied func(check *RouteCheck, answer Answer) Reply
	// Releaser gives back the permits of allowed answers (concurrency policies); nil: the
	// middleware's client.
	Releaser Releaser
}

// sidecarWatch counts decisions made without the sidecar and logs at most once per interval.
type sidecarWatch struct {
	opts     MiddlewareOptions
	mu       sync.Mutex
	lastLog  time.Time
	unlogged int
}

func (w *sidecarWatch) record(check *RouteCheck, err error) {
	w.mu.Lock()
	w.unlogged++
	now := time.Now()
	due := w.lastLog.IsZero() || now.Sub(w.lastLog) >= w.opts.LogInterval
	unlogged := w.unlogged
	if due {
		w.lastLog, w.unlogged = now, 0
	}
	w.mu.Unlock()
	if due {
		mode := "open"
		if check.OnUnreachable == FailClosed {
			mode = "closed"
		}
		w.opts.Logger.Printf("sluice unreachable: %d decision(s) without the sidecar in the last %v (this one: %s): %v",
			unlogged, w.opts.LogInterval, mode, err)
	}
	if w.opts.OnFallback != nil {
		w.opts.OnFallback(check, err)
	}
}

// Middleware asks client about every request route returns a check for, and answers denied ones
// itself (429, or 503 for a fail-closed policy or an unreachable sidecar on a FailClosed route);
// allowed requests reach next with the rate-limit headers set. A nil logger logs to log's default.
func Middleware(client *Client, route Route, logger *log.Logger) func(http.Handler) http.Handler {
	return MiddlewareWith(client, route, MiddlewareOptions{Logger: logger})
}

// MiddlewareWith is Middleware with hooks: every decision made without the sidecar counted
// (OnFallback) and logged at most once per LogInterval, and denials shaped (OnDenied).
//
// An allowed answer's permit (a concurrency policy) is released exactly once: when next returns
// or panics, or when the request's context ends first (the client went away, also mid-way
// through a streamed answer; an http.TimeoutHandler around the middleware timed out). A failed
// release is logged, never answered (the permit returns at its permit_ttl).
func MiddlewareWith(client *Client, route Route, opts MiddlewareOptions) func(http.Handler) http.Handler {
	if opts.Logger == nil {
		opts.Logger = log.Default()
	}
	if opts.LogInterval <= 0 {
		opts.LogInterval = DefaultLogInterval
	}
	watch := &sidecarWatch{opts: opts}
	logger := opts.Logger
	releaser := opts.Releaser
	if releaser == nil {
		releaser = client
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			check := route(r)
			if check == nil {
				next.ServeHTTP(w, r)
				return
			}
			var reply Reply
			var permit string
			switch check.Refuse {
			case 0:
				answer, err := client.Check(r.Context(), check.Check)
				if err == nil && answer.Status == http.StatusOK {
					permit = answer.Result.Permit
				}
				var unreachable *Error
				if errors.As(err, &unreachable) {
					watch.record(check, err)
				}
				reply = ReplyFor(check, answer, err, logger)
				if err == nil && answer.Status == http.StatusTooManyRequests && opts.OnDenied != nil {
					if shaped := opts.OnDenied(check, answer); shaped.Status != 0 {
						reply = shaped
					}
				}
			case http.StatusRequestEntityTooLarge:
				reply = jsonReply(check.Refuse, nil, `{"error":"payload_too_large"}`)
			default:
				reply = jsonReply(check.Refuse, nil, `{"error":"refused"}`)
			}
			for name, values := range reply.Headers {
				if reply.Status != 0 || name != "Retry-After" {
					w.Header()[name] = values
				}
			}
			if reply.Status == 0 {
				if permit != "" {
					serveHolding(&heldPermit{through: releaser, permit: permit, logger: logger}, next, w, r)
					return
				}
				next.ServeHTTP(w, r)
				return
			}
			w.WriteHeader(reply.Status)
			_, _ = w.Write(reply.Body)
		})
	}
}
