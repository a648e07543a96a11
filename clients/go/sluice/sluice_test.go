package sluice

// The package against a real daemon serving the shipped policies (public_api: token bucket,
// burst 150, fail open; login: 10 per 5 min per ip, fail closed). The Rust test
// tests/deploy/clients.rs starts it and sets SLUICE_TEST_URL, SLUICE_TEST_SOCKET (the daemon),
// SLUICE_TEST_STORE (memory or redis), SLUICE_TEST_URL_B (with redis: a second daemon on the same
// Redis), SLUICE_TEST_DOWN_URL (a daemon whose Redis is down) and SLUICE_TEST_RUN (keeps this
// run's partitions apart).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	testURL, testSocket, downURL, urlB string
	store, run, missingSocket          string
	quiet                              = log.New(io.Discard, "", 0)
)

func TestMain(m *testing.M) {
	testURL, testSocket, downURL = os.Getenv("SLUICE_TEST_URL"), os.Getenv("SLUICE_TEST_SOCKET"), os.Getenv("SLUICE_TEST_DOWN_URL")
	if testURL == "" || testSocket == "" || downURL == "" {
		fmt.Fprintln(os.Stderr, "SLUICE_TEST_URL, SLUICE_TEST_SOCKET and SLUICE_TEST_DOWN_URL must name a daemon (cargo test --test deploy clients starts them)")
		os.Exit(1)
	}
	urlB, store, run = os.Getenv("SLUICE_TEST_URL_B"), os.Getenv("SLUICE_TEST_STORE"), os.Getenv("SLUICE_TEST_RUN")
	if store == "" {
		store = "memory"
	}
	if run == "" {
		run = strconv.Itoa(os.Getpid())
	}
	missingSocket = filepath.Join(os.TempDir(), "sluice-missing-"+run+".sock")
	os.Exit(m.Run())
}

// ip is a partition of this run alone.
func ip(name string) string { return name + "-" + store + "-" + run }

// client is a client of opts' daemon; calls to a live one get a generous deadline, for a busy
// machine (the default is 500 ms).
func client(t *testing.T, opts Options) *Client {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	c, err := NewClient(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func mustCheck(t *testing.T, c *Client, check Check) Answer {
	t.Helper()
	answer, err := c.Check(context.Background(), check)
	if err != nil {
		t.Fatal(err)
	}
	return answer
}

func login(who string) Check {
	return Check{Policy: "login", Descriptors: map[string]string{"ip": who}}
}

func TestChecksOverTheSocketAndTCPOnKeptAliveConnections(t *testing.T) {
	who := ip("client")
	first := mustCheck(t, client(t, Options{Socket: testSocket}), login(who))
	if first.Status != 200 || *first.Result.Remaining != 9 || *first.Result.Limit != 10 {
		t.Fatalf("first: %+v", first)
	}
	if got := first.Headers.Get("X-RateLimit-Remaining"); got != "9" {
		t.Fatalf("X-RateLimit-Remaining %q", got)
	}
	// Count the connections the daemon sees through a client of a counting transport.
	c := client(t, Options{URL: testURL})
	dials := 0
	transport := c.http.Transport.(*http.Transport)
	transport.DialContext = countingDial(transport, &dials)
	for n := 0; n < 3; n++ {
		check := login(who)
		check.DryRun = n > 0
		if answer := mustCheck(t, c, check); answer.Status != 200 {
			t.Fatalf("check %d: %+v", n, answer)
		}
	}
	if dials != 1 {
		t.Fatalf("%d connections for 3 checks; want 1 kept alive", dials)
	}
}

func TestADenialCarriesTheDaemonsRetryBatchAndReport(t *testing.T) {
	c := client(t, Options{URL: testURL})
	who := ip("denied")
	var last Answer
	for n := 0; n < 11; n++ {
		last = mustCheck(t, c, login(who))
		if want := map[bool]int{true: 429, false: 200}[n == 10]; last.Status != want {
			t.Fatalf("check %d: status %d, want %d", n, last.Status, want)
		}
	}
	if last.Result.Error != "rate_limit" || last.Result.RetryAfterSec == 0 {
		t.Fatalf("denied: %+v", last.Result)
	}
	if got := last.Headers.Get("Retry-After"); got != strconv.FormatUint(last.Result.RetryAfterSec, 10) {
		t.Fatalf("Retry-After %q, body %d", got, last.Result.RetryAfterSec)
	}

	key := ip("batch")
	api := Check{Policy: "public_api", Descriptors: map[string]string{"tenant": "acme", "api_key": key}}
	spend50 := api
	spend50.Cost = 50
	results, answer, err := c.Batch(context.Background(), []Check{login(key), spend50})
	if err != nil || answer.Status != 200 || len(results) != 2 {
		t.Fatalf("batch: %v %+v %+v", err, answer, results)
	}
	if !results[0].Allowed || *results[0].Remaining != 9 || !results[1].Allowed || *results[1].Remaining != 100 {
		t.Fatalf("batch results: %+v %+v", results[0], results[1])
	}
	spend200 := api
	spend200.Cost = 200
	spent, err := c.Report(context.Background(), spend200)
	if err != nil || spent.Status != 200 || spent.Result.WithinLimit == nil || *spent.Result.WithinLimit {
		t.Fatalf("report: %v %+v", err, spent)
	}
	if after := mustCheck(t, c, api); after.Status != 429 {
		t.Fatalf("after the report: %+v", after)
	}
}

func TestAnUnreachableDaemonIsAnErrorWithinTheDeadline(t *testing.T) {
	c := client(t, Options{Socket: missingSocket, Timeout: 200 * time.Millisecond})
	_, err := c.Check(context.Background(), login("x"))
	var sluiceErr *Error
	if !errors.As(err, &sluiceErr) {
		t.Fatalf("want *Error, got %v", err)
	}
}

// route is the test application's: /login per client ip, fail closed; /graphql on the public API,
// its cost the query's (a field of the JSON body), fail open; the rest free.
func route(r *http.Request) *RouteCheck {
	switch r.URL.Path {
	case "/graphql-small":
		if _, err := ReadBody(r, 16); errors.Is(err, ErrBodyTooLarge) {
			return &RouteCheck{Refuse: http.StatusRequestEntityTooLarge}
		}
		return nil
	case "/login":
		return &RouteCheck{Check: Check{Policy: "login", Descriptors: map[string]string{"ip": r.Header.Get("X-Test-IP")}}, OnUnreachable: FailClosed}
	case "/graphql":
		raw, err := ReadBody(r, 1<<20)
		var query struct {
			Cost uint64 `json:"cost"`
		}
		if err != nil || (len(raw) > 0 && json.Unmarshal(raw, &query) != nil) {
			query.Cost = 1
		}
		return &RouteCheck{Check: Check{Policy: "public_api", Cost: query.Cost,
			Descriptors: map[string]string{"tenant": "acme", "api_key": r.Header.Get("X-Test-Key")}}}
	case "/broken":
		return &RouteCheck{Check: Check{Policy: "login"}}
	}
	return nil
}

func serve(c *Client, path string, headers map[string]string, body string) *httptest.ResponseRecorder {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write(append([]byte("served:"), raw...))
	})
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	for name, value := range headers {
		req.Header.Set(name, value)
	}
	rec := httptest.NewRecorder()
	Middleware(c, route, quiet)(app).ServeHTTP(rec, req)
	return rec
}

func TestLoginIsDeniedWithTheDocumented429(t *testing.T) {
	c := client(t, Options{URL: testURL})
	headers := map[string]string{"X-Test-IP": ip("login-mw")}
	for n := 0; n < 10; n++ {
		rec := serve(c, "/login", headers, "")
		if rec.Code != 200 || rec.Header().Get("X-RateLimit-Remaining") != strconv.Itoa(9-n) || rec.Header().Get("Retry-After") != "" {
			t.Fatalf("request %d: %d %v %s", n, rec.Code, rec.Header(), rec.Body)
		}
	}
	rec := serve(c, "/login", headers, "")
	if rec.Code != 429 {
		t.Fatalf("status %d", rec.Code)
	}
	var body map[string]interface{}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || len(body) != 2 || body["error"] != "rate_limit" {
		t.Fatalf("body %s (%v)", rec.Body, err)
	}
	retry, _ := body["retry_after_sec"].(float64)
	h := rec.Header()
	if retry <= 0 || h.Get("Retry-After") != strconv.Itoa(int(retry)) {
		t.Fatalf("retry_after_sec %v, Retry-After %q", retry, h.Get("Retry-After"))
	}
	if h.Get("X-RateLimit-Remaining") != "0" || h.Get("X-RateLimit-Limit") != "10" || h.Get("RateLimit") == "" ||
		h.Get("RateLimit-Policy") == "" || h.Get("Content-Type") != "application/json" {
		t.Fatalf("headers %v", h)
	}
}

func TestTheCostComesFromTheRequestAndTheBodyStillReachesTheApp(t *testing.T) {
	query := `{"query": "{ a b c }", "cost": 40}`
	rec := serve(client(t, Options{Socket: testSocket}), "/graphql", map[string]string{"X-Test-Key": ip("graphql-mw")}, query)
	if rec.Code != 200 || rec.Body.String() != "served:"+query || rec.Header().Get("X-RateLimit-Remaining") != "110" {
		t.Fatalf("%d %v %s", rec.Code, rec.Header(), rec.Body)
	}
}

func TestABodyOverTheBoundIsA413AndSpendsNothing(t *testing.T) {
	c := client(t, Options{URL: testURL})
	headers := map[string]string{"X-Test-Key": ip("big-mw")}
	rec := serve(c, "/graphql-small", headers, `{"cost": 40, "pad": "xxxxxxxx"}`)
	if rec.Code != 413 || rec.Body.String() != `{"error":"payload_too_large"}` {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	rec = serve(c, "/graphql", headers, "{}")
	if rec.Code != 200 || rec.Header().Get("X-RateLimit-Remaining") != "149" {
		t.Fatalf("%d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	// A route that lets an oversized body through hands the handler all of it.
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(strings.Repeat("x", 40)))
	if _, err := ReadBody(req, 16); !errors.Is(err, ErrBodyTooLarge) {
		t.Fatalf("want ErrBodyTooLarge, got %v", err)
	}
	if all, _ := io.ReadAll(req.Body); len(all) != 40 {
		t.Fatalf("the handler read %d of 40 bytes", len(all))
	}
}

func TestAnUnreachableSidecarFollowsTheRoute(t *testing.T) {
	c := client(t, Options{Socket: missingSocket, Timeout: 200 * time.Millisecond})
	rec := serve(c, "/login", map[string]string{"X-Test-IP": "x"}, "")
	if rec.Code != 503 || rec.Body.String() != `{"error":"limiter_unavailable"}` {
		t.Fatalf("closed: %d %s", rec.Code, rec.Body)
	}
	rec = serve(c, "/graphql", map[string]string{"X-Test-Key": "x"}, `{"cost": 1}`)
	if rec.Code != 200 || rec.Body.String() != `served:{"cost": 1}` {
		t.Fatalf("open: %d %s", rec.Code, rec.Body)
	}
	if rec = serve(c, "/free", nil, ""); rec.Code != 200 || rec.Body.String() != "served:" {
		t.Fatalf("free: %d %s", rec.Code, rec.Body)
	}
}

func TestAFailClosedPolicyOnAStoreThatIsDownAnswers503(t *testing.T) {
	c := client(t, Options{URL: downURL})
	rec := serve(c, "/login", map[string]string{"X-Test-IP": ip("down-mw")}, "")
	if rec.Code != 503 || rec.Body.String() != `{"error":"limiter_unavailable"}` {
		t.Fatalf("login: %d %s", rec.Code, rec.Body)
	}
	rec = serve(c, "/graphql", map[string]string{"X-Test-Key": ip("down-mw")}, "{}")
	if rec.Code != 200 || rec.Body.String() != "served:{}" || rec.Header().Get("X-RateLimit-Remaining") != "" {
		t.Fatalf("public_api fails open, without quota headers: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
}

func TestACheckTheDaemonRejectsIsA500NotAnOpenDoor(t *testing.T) {
	rec := serve(client(t, Options{URL: testURL}), "/broken", nil, "")
	if rec.Code != 500 || rec.Body.String() != `{"error":"limiter_rejected"}` {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
}

func TestRedisStateIsSharedBetweenDaemons(t *testing.T) {
	if store != "redis" {
		t.Skip("shared state needs Redis")
	}
	if urlB == "" {
		t.Fatal("SLUICE_TEST_URL_B names the second daemon on the same Redis")
	}
	headers := map[string]string{"X-Test-IP": ip("shared-mw")}
	a := client(t, Options{URL: testURL})
	for n := 0; n < 10; n++ {
		if rec := serve(a, "/login", headers, ""); rec.Code != 200 {
			t.Fatalf("request %d on A: %d", n, rec.Code)
		}
	}
	rec := serve(client(t, Options{URL: urlB}), "/login", headers, "")
	if rec.Code != 429 || rec.Header().Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("on B: %d %v", rec.Code, rec.Header())
	}
}

// countingDial dials as transport would, counting the connections opened.
func countingDial(transport *http.Transport, dials *int) func(ctx context.Context, network, addr string) (net.Conn, error) {
	inner := transport.DialContext
	if inner == nil {
		inner = (&net.Dialer{}).DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		*dials++
		return inner(ctx, network, addr)
	}
}
