// Command sluice-check asks a sluice daemon whether a request may go through: Go, standard
// library only.
//
//	go run . -socket /var/run/sluice/sluice.sock -policy login -d ip=203.0.113.7
//	go run . -url http://127.0.0.1:7070 -d tenant=acme -d api_key=k1 -cost 5
//
// Defaults come from SLUICE_SOCKET / SLUICE_URL (set by `sluice inject` in every app container).
// Exit code 0 allowed, 1 denied (429), 2 limiter unavailable (503), 64 rejected request (4xx),
// 69 daemon unreachable.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Answer is the daemon's JSON answer (the wire contract of POST /v1/check).
type Answer struct {
	Allowed       bool    `json:"allowed"`
	Policy        *string `json:"policy"`
	Limit         *uint64 `json:"limit"`
	Remaining     *uint64 `json:"remaining"`
	ResetAfterMs  uint64  `json:"reset_after_ms"`
	RetryAfterMs  uint64  `json:"retry_after_ms"`
	Mode          string  `json:"mode"`
	Error         string  `json:"error"`
	Reason        string  `json:"reason"`
	RetryAfterSec uint64  `json:"retry_after_sec"`
}

// Request is the body of POST /v1/check.
type Request struct {
	Policy      string            `json:"policy,omitempty"`
	Descriptors map[string]string `json:"descriptors"`
	Cost        uint64            `json:"cost"`
	DryRun      bool              `json:"dry_run"`
}

// Client talks to one daemon; share it between goroutines (it keeps connections alive).
type Client struct {
	http *http.Client
	base string
}

// NewClient calls the daemon over socketPath when it is set, else over baseURL.
func NewClient(socketPath, baseURL string) *Client {
	transport := &http.Transport{MaxIdleConnsPerHost: 16}
	if socketPath != "" {
		transport.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socketPath)
		}
		baseURL = "http://sluice"
	}
	return &Client{http: &http.Client{Transport: transport, Timeout: 500 * time.Millisecond}, base: baseURL}
}

// Check asks for one request; returns the HTTP status and the answer.
func (c *Client) Check(ctx context.Context, req Request) (int, Answer, error) {
	var answer Answer
	body, err := json.Marshal(req)
	if err != nil {
		return 0, answer, err
	}
	httpReq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/check", bytes.NewReader(body))
	if err != nil {
		return 0, answer, err
	}
	httpReq.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(httpReq)
	if err != nil {
		return 0, answer, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&answer)
	return resp.StatusCode, answer, err
}

type descriptorFlags map[string]string

func (d descriptorFlags) String() string { return fmt.Sprint(map[string]string(d)) }

func (d descriptorFlags) Set(pair string) error {
	name, value, ok := strings.Cut(pair, "=")
	if !ok {
		return fmt.Errorf("%q is not NAME=VALUE", pair)
	}
	d[name] = value
	return nil
}

func str(p *string) string {
	if p == nil {
		return "-"
	}
	return *p
}

func main() {
	descriptors := descriptorFlags{}
	socketPath := flag.String("socket", os.Getenv("SLUICE_SOCKET"), "daemon's Unix socket")
	defaultURL := os.Getenv("SLUICE_URL")
	if defaultURL == "" {
		defaultURL = "http://127.0.0.1:7070"
	}
	baseURL := flag.String("url", defaultURL, "daemon's TCP address (used when -socket is empty)")
	policy := flag.String("policy", "", "check only this policy")
	cost := flag.Uint64("cost", 1, "units to spend")
	dryRun := flag.Bool("dry-run", false, "evaluate without spending")
	flag.Var(descriptors, "d", "descriptor NAME=VALUE (repeatable)")
	// A usage error exits 64: 1 and 2 mean denied and unavailable.
	flag.CommandLine.Init(os.Args[0], flag.ContinueOnError)
	if err := flag.CommandLine.Parse(os.Args[1:]); err != nil {
		usage(err.Error())
	}
	urlGiven := false
	flag.Visit(func(f *flag.Flag) { urlGiven = urlGiven || f.Name == "url" })
	if urlGiven {
		*socketPath = ""
	}
	if *socketPath == "" {
		*baseURL = parseURL(*baseURL)
	}

	client := NewClient(*socketPath, *baseURL)
	status, answer, err := client.Check(context.Background(), Request{
		Policy: *policy, Descriptors: descriptors, Cost: *cost, DryRun: *dryRun,
	})
	if err != nil {
		// An application chooses here: fail open (serve the request) or closed (refuse it).
		fmt.Fprintf(os.Stderr, "sluice unreachable: %v\n", err)
		os.Exit(69)
	}
	switch status {
	case http.StatusOK:
		fmt.Printf("allowed policy=%s remaining=%d mode=%s\n", str(answer.Policy), deref(answer.Remaining), answer.Mode)
	case http.StatusTooManyRequests:
		fmt.Printf("denied policy=%s retry_after_sec=%d\n", str(answer.Policy), answer.RetryAfterSec)
		os.Exit(1)
	case http.StatusServiceUnavailable:
		fmt.Printf("unavailable policy=%s\n", str(answer.Policy))
		os.Exit(2)
	default:
		fmt.Fprintf(os.Stderr, "error %d: %s: %s\n", status, answer.Error, answer.Reason)
		os.Exit(64)
	}
}

func usage(message string) {
	fmt.Fprintf(os.Stderr, "usage error: %s\n", message)
	os.Exit(64)
}

// parseURL accepts http://127.0.0.1:7070, 127.0.0.1:7070 or localhost:7070.
func parseURL(text string) string {
	full := text
	if !strings.Contains(text, "://") {
		full = "http://" + text
	}
	u, err := url.Parse(full)
	if err != nil || u.Scheme != "http" || u.Hostname() == "" || u.Port() == "" || (u.Path != "" && u.Path != "/") {
		usage(fmt.Sprintf("-url %q is not an address such as http://127.0.0.1:7070", text))
	}
	return "http://" + u.Host
}

func deref(p *uint64) uint64 {
	if p == nil {
		return 0
	}
	return *p
}
