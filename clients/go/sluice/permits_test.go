package sluice

// Permits through the net/http middleware, in a real server (httptest's, on loopback) against
// the real daemon: `slots` is a concurrency policy of one permit per tenant whose permit_ttl is
// an hour (tests/deploy/clients.rs adds it to the shipped policies), so a slot that comes back
// within the test came back by a release. Each path of a request is one scenario on a tenant of
// its own: the slot is seen held while the request runs and free after it, asked of the daemon
// (a dry run: 200 while free, 429 while held); the releases are counted (exactly one, answered
// released: true).

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// streamChunks is how long a streamed answer lasts when nobody stops it (1 KiB every 10 ms).
const streamChunks = 800

// countingReleaser releases through a real client and records each answer's Released (or the
// error); with dead set, it releases through a client of a port nothing listens on.
type countingReleaser struct {
	through *Client
	dead    *Client
	mu      sync.Mutex
	results []interface{}
}

func (c *countingReleaser) Release(ctx context.Context, permit string) (Answer, error) {
	through := c.through
	if c.dead != nil {
		through = c.dead
	}
	answer, err := through.Release(ctx, permit)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.results = append(c.results, err)
	} else if answer.Result.Released != nil {
		c.results = append(c.results, *answer.Result.Released)
	} else {
		c.results = append(c.results, answer.Status)
	}
	return answer, err
}

func (c *countingReleaser) seen() []interface{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]interface{}{}, c.results...)
}

func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func eventually(t *testing.T, what string, predicate func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if predicate() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("not within 5 s: %s", what)
}

func slotFree(t *testing.T, c *Client, tenant string) bool {
	t.Helper()
	answer := mustCheck(t, c, Check{Policy: "slots", Descriptors: map[string]string{"tenant": tenant}, DryRun: true})
	if answer.Status != http.StatusOK && answer.Status != http.StatusTooManyRequests {
		t.Fatalf("dry run: %d %s", answer.Status, answer.Body)
	}
	return answer.Status == http.StatusOK
}

// permitScenario is one scenario's server: its handlers wait on gate; finished holds the paths
// whose handler returned; logs the middleware's lines.
type permitScenario struct {
	url      string
	gate     chan struct{}
	releases *countingReleaser
	mu       sync.Mutex
	finished map[string]bool
	logs     bytes.Buffer
	daemon   *Client
	openGate func()
}

func (s *permitScenario) done(path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.finished[path] = true
}

func (s *permitScenario) hasFinished(path string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.finished[path]
}

func servePermits(t *testing.T, fail bool) *permitScenario {
	s := &permitScenario{gate: make(chan struct{}), finished: map[string]bool{}, daemon: client(t, Options{URL: testURL})}
	s.releases = &countingReleaser{through: client(t, Options{URL: testURL})}
	if fail {
		s.releases.dead = client(t, Options{URL: closedPort(t)})
	}
	logger := log.New(&lockedWriter{w: &s.logs, mu: &s.mu}, "", 0)
	route := func(r *http.Request) *RouteCheck {
		return &RouteCheck{Check: Check{Policy: "slots", Descriptors: map[string]string{"tenant": r.URL.Query().Get("t")}}, OnUnreachable: FailClosed}
	}
	limited := MiddlewareWith(s.daemon, route, MiddlewareOptions{Logger: logger, Releaser: s.releases})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer s.done(r.URL.Path)
		switch r.URL.Path {
		case "/stream":
			// Writes on whether anyone reads or not, the request's context unheeded.
			for n := 0; n < streamChunks; n++ {
				select {
				case <-s.gate: // the scenario is over
					return
				default:
				}
				_, _ = w.Write([]byte(strings.Repeat("chunk", 200)))
				w.(http.Flusher).Flush()
				time.Sleep(10 * time.Millisecond)
			}
			return
		case "/slow":
			<-s.gate // unheeding its context: the TimeoutHandler answers
			return
		}
		<-s.gate
		if r.URL.Path == "/panic" {
			panic("the handler failed")
		}
		for _, part := range []string{"one,", "two,", "three"} {
			_, _ = w.Write([]byte(part))
			w.(http.Flusher).Flush()
		}
	})
	mux := http.NewServeMux()
	mux.Handle("/slow", http.TimeoutHandler(limited(handler), time.Second, "timeout"))
	mux.Handle("/", limited(handler))
	server := httptest.NewUnstartedServer(mux)
	server.Config.ErrorLog = quiet // the panic's trace
	server.Start()
	t.Cleanup(server.Close) // after the gate opens (cleanups run last first): it waits for the handlers
	var gateOnce sync.Once
	s.openGate = func() { gateOnce.Do(func() { close(s.gate) }) }
	t.Cleanup(s.openGate)
	s.url = server.URL
	return s
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

type outcome struct {
	status int
	body   string
	err    error
}

// start asks path in a goroutine and, with held, waits until the daemon holds the slot.
func (s *permitScenario) start(t *testing.T, path, tenant string, held bool) chan outcome {
	if !slotFree(t, s.daemon, tenant) {
		t.Fatal("the slot is free before the request")
	}
	result := make(chan outcome, 1)
	go func() {
		c := &http.Client{Timeout: 15 * time.Second}
		resp, err := c.Get(s.url + path + "?t=" + tenant)
		if err != nil {
			result <- outcome{err: err}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		result <- outcome{status: resp.StatusCode, body: string(body), err: err}
	}()
	if held {
		eventually(t, "the slot held while the request runs", func() bool { return !slotFree(t, s.daemon, tenant) })
	}
	return result
}

// rawGet asks path for tenant (whose slot must be free) on a connection of its own, left open.
func (s *permitScenario) rawGet(t *testing.T, path, tenant string) net.Conn {
	t.Helper()
	if !slotFree(t, s.daemon, tenant) {
		t.Fatal("the slot is free before the request")
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte("GET " + path + "?t=" + tenant + " HTTP/1.1\r\nHost: app\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	return conn
}

// abandon closes conn with a reset: a client gone.
func abandon(conn net.Conn) {
	_ = conn.(*net.TCPConn).SetLinger(0)
	conn.Close()
}

func (s *permitScenario) releasedOnce(t *testing.T, tenant string) {
	t.Helper()
	eventually(t, "the slot back", func() bool { return slotFree(t, s.daemon, tenant) })
	eventually(t, "one release", func() bool { return len(s.releases.seen()) == 1 })
	time.Sleep(100 * time.Millisecond) // a second release would show now
	if got := s.releases.seen(); len(got) != 1 || got[0] != true {
		t.Fatalf("releases %v; want exactly one, that gave the slot back", got)
	}
}

func wait(t *testing.T, result chan outcome) outcome {
	t.Helper()
	select {
	case out := <-result:
		return out
	case <-time.After(15 * time.Second):
		t.Fatal("no answer")
	}
	return outcome{}
}

func TestPermitReleasedWhenTheAnswerIsSent(t *testing.T) {
	s := servePermits(t, false)
	tenant := ip("permit-ok")
	result := s.start(t, "/ok", tenant, true)
	s.openGate()
	if out := wait(t, result); out.status != 200 || out.body != "one,two,three" {
		t.Fatalf("%+v", out)
	}
	s.releasedOnce(t, tenant)
}

func TestPermitReleasedWhenTheHandlerPanics(t *testing.T) {
	s := servePermits(t, false)
	tenant := ip("permit-panic")
	result := s.start(t, "/panic", tenant, true)
	s.openGate()
	if out := wait(t, result); out.err == nil {
		t.Fatalf("a panic aborts the answer: %+v", out)
	}
	s.releasedOnce(t, tenant)
}

func TestPermitReleasedOnATimeout(t *testing.T) {
	s := servePermits(t, false)
	tenant := ip("permit-slow")
	result := s.start(t, "/slow", tenant, false)
	if out := wait(t, result); out.status != http.StatusServiceUnavailable || out.body != "timeout" {
		t.Fatalf("%+v", out)
	}
	s.releasedOnce(t, tenant)
	if s.hasFinished("/slow") {
		t.Fatal("given back at the timeout, while the handler still runs")
	}
}

func TestPermitReleasedWhenTheClientDisconnectsMidStream(t *testing.T) {
	s := servePermits(t, false)
	tenant := ip("permit-stream")
	conn := s.rawGet(t, "/stream", tenant)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	seen := make([]byte, 0, 8192)
	buf := make([]byte, 4096)
	for !bytes.Contains(seen, []byte("chunk")) {
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("the stream started: %v", err)
		}
		seen = append(seen, buf[:n]...)
	}
	if slotFree(t, s.daemon, tenant) {
		t.Fatal("held while the stream runs")
	}
	abandon(conn) // mid-stream
	s.releasedOnce(t, tenant)
	if s.hasFinished("/stream") {
		t.Fatal("given back when the client left, not when the stream would have ended")
	}
}

func TestPermitReleasedWhenTheClientLeavesBeforeTheAnswer(t *testing.T) {
	s := servePermits(t, false)
	tenant := ip("permit-gone")
	conn := s.rawGet(t, "/ok", tenant)
	eventually(t, "the slot held while the handler waits", func() bool { return !slotFree(t, s.daemon, tenant) })
	abandon(conn)
	s.releasedOnce(t, tenant)
	if s.hasFinished("/ok") {
		t.Fatal("given back when the client left, not when the handler ended")
	}
	// The handler goes on and ends; that releases nothing more.
	s.openGate()
	eventually(t, "the handler ended", func() bool { return s.hasFinished("/ok") })
	time.Sleep(100 * time.Millisecond)
	if got := s.releases.seen(); len(got) != 1 {
		t.Fatalf("releases %v; want exactly one", got)
	}
}

func TestPermitReleaseThatFailsIsLoggedAndTheAnswerIsWhole(t *testing.T) {
	s := servePermits(t, true)
	tenant := ip("permit-fail")
	result := s.start(t, "/ok", tenant, true)
	s.openGate()
	if out := wait(t, result); out.status != 200 || out.body != "one,two,three" {
		t.Fatalf("%+v", out)
	}
	eventually(t, "the release tried", func() bool { return len(s.releases.seen()) == 1 })
	var unreachable *Error
	if err, ok := s.releases.seen()[0].(error); !ok || !errors.As(err, &unreachable) {
		t.Fatalf("releases %v", s.releases.seen())
	}
	eventually(t, "the failure logged", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return strings.Contains(s.logs.String(), "release failed")
	})
	if slotFree(t, s.daemon, tenant) {
		t.Fatal("nothing given back: held until its permit_ttl")
	}
}

func TestPermitReleaseCall(t *testing.T) {
	c := client(t, Options{URL: testURL})
	tenant := ip("permit-plain")
	slots := Check{Policy: "slots", Descriptors: map[string]string{"tenant": tenant}}
	first := mustCheck(t, c, slots)
	if first.Status != 200 || first.Result.Permit == "" {
		t.Fatalf("%d %s", first.Status, first.Body)
	}
	if again := mustCheck(t, c, slots); again.Status != http.StatusTooManyRequests {
		t.Fatalf("%d %s", again.Status, again.Body)
	}
	for _, want := range []bool{true, false} {
		answer, err := c.Release(context.Background(), first.Result.Permit)
		if err != nil || answer.Status != 200 || answer.Result.Released == nil || *answer.Result.Released != want {
			t.Fatalf("%v %d %s; want released %v", err, answer.Status, answer.Body, want)
		}
	}
	bad, err := c.Release(context.Background(), "not-a-permit")
	if err != nil || bad.Status != 400 || bad.Result.Error != "bad_permit" {
		t.Fatalf("%v %d %s", err, bad.Status, bad.Body)
	}
}
