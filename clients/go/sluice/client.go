// Package sluice is a client of the sluice rate-limit sidecar (Unix socket or TCP, kept-alive
// connections, one deadline per call), net/http middleware answering the documented 429 and 503,
// and the client's address behind proxies (ClientIP). Standard library only. Import it as
// github.com/sluice-rs/sluice/clients/go/sluice: the import path ends in the package's name.
package sluice

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// DefaultTimeout bounds one call (a sidecar answers in well under a millisecond).
const DefaultTimeout = 500 * time.Millisecond

// maxAnswerBytes bounds an answer read from the daemon (its answers are a few hundred bytes).
const maxAnswerBytes = 1 << 20

// maxHeaderBytes bounds the status line and headers of an answer.
const maxHeaderBytes = 64 << 10

// RateLimitHeaders are the headers the daemon sets, copied onto the application's answers.
var RateLimitHeaders = []string{
	"Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset",
	"RateLimit-Policy", "RateLimit",
}

// Error says the daemon could not be asked: unreachable, too slow, or an answer that is not JSON.
type Error struct{ Err error }

func (e *Error) Error() string { return "sluice: " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Check is one request's question (the body of POST /v1/check).
type Check struct {
	Policy      string            `json:"policy,omitempty"`
	Descriptors map[string]string `json:"descriptors"`
	// Cost is the units to spend; 0 means 1.
	Cost   uint64 `json:"cost"`
	DryRun bool   `json:"dry_run"`
}

// Result is the daemon's JSON answer (the wire contract of POST /v1/check).
type Result struct {
	Allowed       bool    `json:"allowed"`
	Policy        *string `json:"policy"`
	Limit         *uint64 `json:"limit"`
	Remaining     *uint64 `json:"remaining"`
	ResetAfterMs  uint64  `json:"reset_after_ms"`
	RetryAfterMs  uint64  `json:"retry_after_ms"`
	Mode          string  `json:"mode"`
	Error         string  `json:"error,omitempty"`
	Reason        string  `json:"reason,omitempty"`
	RetryAfterSec uint64  `json:"retry_after_sec,omitempty"`
	WithinLimit   *bool   `json:"within_limit,omitempty"`
	// Permit is the token of the permit an allowed check holds (a concurrency policy applied):
	// give it back with Client.Release when the request ends. Empty when none is held.
	Permit string `json:"permit,omitempty"`
	// Released is a release's answer (POST /v1/release): whether a held permit came back.
	Released *bool `json:"released,omitempty"`
}

// Answer is one call's outcome: the HTTP status, the JSON body (decoded, and as received) and
// the rate-limit headers.
type Answer struct {
	Status  int
	Result  Result
	Body    []byte
	Headers http.Header
}

// Client talks to one daemon; share it between goroutines (it keeps connections alive).
type Client struct {
	http *http.Client
	base string
}

// Options says where the daemon is: Socket (a Unix socket path) or URL; with neither,
// SLUICE_SOCKET, then SLUICE_URL, then http://127.0.0.1:7070 (the order of `sluice check`).
type Options struct {
	Socket  string
	URL     string
	Timeout time.Duration // DefaultTimeout when 0
}

// NewClient returns a client of the daemon Options names.
func NewClient(opts Options) (*Client, error) {
	if opts.Socket != "" && opts.URL != "" {
		return nil, errors.New("give a socket or a URL, not both")
	}
	if opts.Socket == "" && opts.URL == "" {
		opts.Socket = os.Getenv("SLUICE_SOCKET")
		if opts.Socket == "" {
			opts.URL = os.Getenv("SLUICE_URL")
		}
		if opts.Socket == "" && opts.URL == "" {
			opts.URL = "http://127.0.0.1:7070"
		}
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	// The daemon's headers are a few hundred bytes: a head over maxHeaderBytes is an error.
	transport := &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 90 * time.Second, MaxResponseHeaderBytes: maxHeaderBytes}
	base := "http://sluice"
	if opts.Socket != "" {
		socket := opts.Socket
		transport.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}
	} else {
		host, err := ParseURL(opts.URL)
		if err != nil {
			return nil, err
		}
		base = "http://" + host
	}
	// A redirect is never followed: the daemon does not send one, and a check answered by
	// another address could let a request through (the 3xx is a rejected check, a 500).
	noRedirects := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &Client{http: &http.Client{Transport: transport, Timeout: opts.Timeout, CheckRedirect: noRedirects}, base: base}, nil
}

// ParseURL accepts http://127.0.0.1:7070, 127.0.0.1:7070 or localhost:7070 and returns host:port.
func ParseURL(text string) (string, error) {
	full := text
	if !strings.Contains(text, "://") {
		full = "http://" + text
	}
	u, err := url.Parse(full)
	if err != nil || u.Scheme != "http" || u.Hostname() == "" || u.Port() == "" ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("%q is not an address such as http://127.0.0.1:7070", text)
	}
	return u.Host, nil
}

// Check asks POST /v1/check. An error is an *Error: the daemon could not be asked.
func (c *Client) Check(ctx context.Context, check Check) (Answer, error) {
	return c.Call(ctx, "/v1/check", normalized(check))
}

// Report spends a cost known only afterwards (an LLM's tokens): POST /v1/report.
func (c *Client) Report(ctx context.Context, check Check) (Answer, error) {
	return c.Call(ctx, "/v1/report", normalized(check))
}

// Batch asks several independent checks in one call (POST /v1/check/batch); the results come in
// order. A refused batch (status other than 200) is in the Answer, with no results.
func (c *Client) Batch(ctx context.Context, checks []Check) ([]Result, Answer, error) {
	body := struct {
		Checks []Check `json:"checks"`
	}{make([]Check, len(checks))}
	for i, check := range checks {
		body.Checks[i] = normalized(check)
	}
	var out struct {
		Results []Result `json:"results"`
	}
	answer, raw, err := c.call(ctx, "/v1/check/batch", body)
	if err != nil || answer.Status != http.StatusOK {
		return nil, answer, err
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, answer, &Error{fmt.Errorf("the daemon's answer is not JSON: %w", err)}
	}
	return out.Results, answer, nil
}

// Call POSTs body as JSON to path and decodes a check-shaped answer.
func (c *Client) Call(ctx context.Context, path string, body interface{}) (Answer, error) {
	answer, raw, err := c.call(ctx, path, body)
	if err != nil {
		return answer, err
	}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &answer.Result); err != nil {
			return answer, &Error{fmt.Errorf("the daemon's answer is not JSON: %w", err)}
		}
	}
	return answer, nil
}

func (c *Client) call(ctx context.Context, path string, body interface{}) (Answer, []byte, error) {
	var answer Answer
	payload, err := json.Marshal(body)
	if err != nil {
		return answer, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(payload))
	if err != nil {
		return answer, nil, &Error{err}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return answer, nil, &Error{err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	if err != nil {
		return answer, nil, &Error{err}
	}
	if len(raw) > maxAnswerBytes {
		return answer, nil, &Error{errors.New("the daemon's answer is too large")}
	}
	answer.Status = resp.StatusCode
	answer.Body = raw
	answer.Headers = http.Header{}
	for _, name := range RateLimitHeaders {
		if value := resp.Header.Get(name); value != "" {
			answer.Headers.Set(name, value)
		}
	}
	return answer, raw, nil
}

// CloseIdleConnections closes the kept-alive connections not in use.
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

func normalized(check Check) Check {
	if check.Cost == 0 {
		check.Cost = 1
	}
	if check.Descriptors == nil {
		check.Descriptors = map[string]string{}
	}
	return check
}
