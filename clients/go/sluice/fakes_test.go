package sluice

// The client and middleware against fake daemons: a redirect is never followed, every decision
// made without the sidecar is counted by the hook and logged once per interval, the unreachable
// 503 carries Retry-After, and a denial can be shaped.

import (
	"bytes"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestARedirectIsNeverFollowed(t *testing.T) {
	var allowedCalls int32
	allowing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		atomic.AddInt32(&allowedCalls, 1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"allowed":true}`)
	}))
	defer allowing.Close()
	redirecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, allowing.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer redirecting.Close()
	c := client(t, Options{URL: redirecting.URL})
	check := &RouteCheck{Check: login("x"), OnUnreachable: FailClosed}
	route := func(*http.Request) *RouteCheck { return check }
	app := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "served") })
	rec := httptest.NewRecorder()
	Middleware(c, route, quiet)(app).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/login", nil))
	if rec.Code != http.StatusInternalServerError || strings.Contains(rec.Body.String(), "served") {
		t.Fatalf("a closed route behind a redirect: %d %q", rec.Code, rec.Body.String())
	}
	if n := atomic.LoadInt32(&allowedCalls); n != 0 {
		t.Fatalf("the redirect was followed %d time(s)", n)
	}
}

func TestEveryDecisionWithoutTheSidecarIsCounted(t *testing.T) {
	var lines bytes.Buffer
	var fallbacks int32
	c := client(t, Options{Socket: missingSocket, Timeout: 500 * time.Millisecond})
	route := func(*http.Request) *RouteCheck {
		return &RouteCheck{Check: login("x"), OnUnreachable: FailClosed}
	}
	handler := MiddlewareWith(c, route, MiddlewareOptions{
		Logger:      log.New(&lines, "", 0),
		OnFallback:  func(*RouteCheck, error) { atomic.AddInt32(&fallbacks, 1) },
		LogInterval: time.Hour,
	})(http.NotFoundHandler())
	for n := 0; n < 5; n++ {
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/login", nil))
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" {
			t.Fatalf("%d Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
		}
	}
	if n := atomic.LoadInt32(&fallbacks); n != 5 {
		t.Fatalf("the hook saw %d of 5 decisions", n)
	}
	if n := strings.Count(lines.String(), "\n"); n != 1 {
		t.Fatalf("%d log lines, want one per interval: %s", n, lines.String())
	}
}

func TestADenialCanBeShaped(t *testing.T) {
	daemon := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "7")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"allowed":false,"error":"rate_limit","retry_after_sec":7}`)
	}))
	defer daemon.Close()
	c := client(t, Options{URL: daemon.URL})
	route := func(*http.Request) *RouteCheck { return &RouteCheck{Check: login("x")} }
	html := func(_ *RouteCheck, answer Answer) Reply {
		return Reply{Status: http.StatusTooManyRequests, Body: []byte("<p>slow down</p>"),
			Headers: http.Header{"Content-Type": {"text/html"}, "Retry-After": {answer.Headers.Get("Retry-After")}}}
	}
	rec := httptest.NewRecorder()
	MiddlewareWith(c, route, MiddlewareOptions{Logger: quiet, OnDenied: html})(http.NotFoundHandler()).
		ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != 429 || rec.Header().Get("Content-Type") != "text/html" || rec.Header().Get("Retry-After") != "7" || rec.Body.String() != "<p>slow down</p>" {
		t.Fatalf("%d %v %q", rec.Code, rec.Header(), rec.Body.String())
	}
}

// rawDaemon answers every connection with raw bytes, then closes it.
func rawDaemon(t *testing.T, raw string) string {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { listener.Close() })
	go func() {
		for n := 0; n < 100; n++ {
			conn, err := listener.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
				buf := make([]byte, 4096)
				_, _ = conn.Read(buf)
				_, _ = io.WriteString(conn, raw)
			}()
		}
	}()
	return "http://" + listener.Addr().String()
}

func TestEveryUnreadableAnswerIsTheRoutesFailureMode(t *testing.T) {
	answers := map[string]string{
		"garbage":          "SMTP ready\r\n\r\n",
		"short body":       "HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{}",
		"not JSON":         "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"oversized header": "HTTP/1.1 200 OK\r\nX-Pad: " + strings.Repeat("a", 2<<20) + "\r\nContent-Length: 2\r\n\r\n{}",
	}
	for name, raw := range answers {
		url := rawDaemon(t, raw)
		for _, mode := range []Unreachable{FailOpen, FailClosed} {
			var fallbacks int32
			c := client(t, Options{URL: url, Timeout: 2 * time.Second})
			route := func(*http.Request) *RouteCheck { return &RouteCheck{Check: login("x"), OnUnreachable: mode} }
			app := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "served") })
			rec := httptest.NewRecorder()
			MiddlewareWith(c, route, MiddlewareOptions{Logger: quiet, OnFallback: func(*RouteCheck, error) { atomic.AddInt32(&fallbacks, 1) }})(app).
				ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/login", nil))
			want := http.StatusOK
			if mode == FailClosed {
				want = http.StatusServiceUnavailable
			}
			if rec.Code != want || atomic.LoadInt32(&fallbacks) != 1 {
				t.Errorf("%s, mode %d: %d (want %d), %d fallbacks", name, mode, rec.Code, want, fallbacks)
			}
		}
	}
}
