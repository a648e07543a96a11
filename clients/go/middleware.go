package sluice

import (
	"errors"
	"log"
	"net/http"
	"strconv"
)

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
//   - unreachable or too slow: through (FailOpen) or that 503 (FailClosed), per route;
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
			logger.Printf("sluice unreachable (open): %v", err)
			return Reply{Headers: http.Header{}}
		}
		logger.Printf("sluice unreachable (closed): %v", err)
		return jsonReply(http.StatusServiceUnavailable, nil, `{"error":"limiter_unavailable"}`)
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

// Middleware asks client about every request route returns a check for, and answers denied ones
// itself (429, or 503 for a fail-closed policy or an unreachable sidecar on a FailClosed route);
// allowed requests reach next with the rate-limit headers set. A nil logger logs to log's default.
func Middleware(client *Client, route Route, logger *log.Logger) func(http.Handler) http.Handler {
	if logger == nil {
		logger = log.Default()
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			check := route(r)
			if check == nil {
				next.ServeHTTP(w, r)
				return
			}
			var reply Reply
			switch check.Refuse {
			case 0:
				answer, err := client.Check(r.Context(), check.Check)
				reply = ReplyFor(check, answer, err, logger)
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
				next.ServeHTTP(w, r)
				return
			}
			w.WriteHeader(reply.Status)
			_, _ = w.Write(reply.Body)
		})
	}
}
