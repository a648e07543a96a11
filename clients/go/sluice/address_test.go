package sluice

// TrustedProxies against unit cases; through a real net/http server and the real daemon (set up
// as docs/api.md says: sluice.ClientIP(r, proxies), never r.RemoteAddr behind a proxy): a client
// rotating X-Forwarded-For gets 10 of 15 logins, two clients behind one trusted proxy 10 each.
// Clients connect from loopback addresses of their own (127.48.4.x), a partition per scenario.

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

func xff(value string) http.Header { return http.Header{"X-Forwarded-For": {value}} }

func TestClientAddressTrustingNothingIsThePeer(t *testing.T) {
	var none TrustedProxies
	for n := 0; n < 20; n++ {
		if got := none.ClientAddress("198.51.100.9:4711", xff("203.0.113."+itoa(n))); got != "198.51.100.9" {
			t.Fatalf("got %q", got)
		}
	}
	if got := none.ClientAddress("[::ffff:198.51.100.9]:80", nil); got != "198.51.100.9" {
		t.Fatalf("mapped: %q", got)
	}
}

func TestClientAddressWalksFromTheRight(t *testing.T) {
	proxies, err := ParseTrustedProxies("10.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		peer   string
		header http.Header
		want   string
	}{
		{"10.0.0.5:1", xff("1.1.1.1, 203.0.113.7"), "203.0.113.7"},
		{"10.0.0.5:1", http.Header{"X-Forwarded-For": {"1.1.1.1, 203.0.113.7", "10.1.2.3"}}, "203.0.113.7"},
		{"198.51.100.1:1", xff("203.0.113.7"), "198.51.100.1"},
		{"10.0.0.5:1", nil, "10.0.0.5"},
		{"10.0.0.5:1", xff("junk, 10.9.9.9"), "10.9.9.9"},
	}
	for _, c := range cases {
		if got := proxies.ClientAddress(c.peer, c.header); got != c.want {
			t.Errorf("%s %v: got %q, want %q", c.peer, c.header, got, c.want)
		}
	}
	hops := TrustedProxies{Hops: 2}
	if got := hops.ClientAddress("192.0.2.1:1", xff("1.1.1.1, 203.0.113.7, 192.0.2.9")); got != "203.0.113.7" {
		t.Errorf("hops: %q", got)
	}
	fwd, _ := ParseTrustedProxies("127.0.0.1/32", "::1/128")
	fwd.Header = HeaderForwarded
	header := http.Header{"Forwarded": {`for=1.1.1.1, for="[2001:db8::7]:4711";proto=https`}}
	if got := fwd.ClientAddress("[::1]:80", header); got != "2001:db8::7" {
		t.Errorf("forwarded: %q", got)
	}
	unix, _ := ParseTrustedProxies("unix")
	if got := unix.ClientAddress("@", xff("203.0.113.7")); got != "203.0.113.7" {
		t.Errorf("unix: %q", got)
	}
	if _, err := ParseTrustedProxies("10.0.0.0/33"); err == nil {
		t.Error("a bad CIDR is an error")
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// serveLogin runs a real net/http server whose /login is limited per ClientIP(r, proxies).
func serveLogin(t *testing.T, proxies TrustedProxies) string {
	t.Helper()
	c := client(t, Options{URL: testURL})
	route := func(r *http.Request) *RouteCheck {
		if r.URL.Path != "/login" {
			return nil
		}
		return &RouteCheck{Check: Check{Policy: "login", Descriptors: map[string]string{"ip": ClientIP(r, proxies)}}, OnUnreachable: FailClosed}
	}
	app := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "welcome") })
	server := httptest.NewServer(Middleware(c, route, quiet)(app))
	t.Cleanup(server.Close)
	return server.URL
}

// logins sends 15 POST /login from source, the n-th with X-Forwarded-For forwarded(n).
func logins(t *testing.T, url, source string, forwarded func(int) string) (ok, denied int) {
	t.Helper()
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 5 * time.Second}
	transport := &http.Transport{DialContext: dialer.DialContext, DisableKeepAlives: true}
	defer transport.CloseIdleConnections()
	httpClient := &http.Client{Transport: transport, Timeout: 10 * time.Second}
	for n := 0; n < 15; n++ {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url+"/login", nil)
		req.Header.Set("X-Forwarded-For", forwarded(n))
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
			denied++
		default:
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	return ok, denied
}

func TestRealServerRotatingForwardedForFromAnUntrustedPeerKeepsOnePartition(t *testing.T) {
	url := serveLogin(t, TrustedProxies{})
	ok, denied := logins(t, url, "127.48.4.1", func(n int) string { return "203.0.113." + itoa(n) })
	if ok != 10 || denied != 5 {
		t.Fatalf("%d allowed, %d denied; want 10 and 5", ok, denied)
	}
}

func TestRealServerClientsBehindOneTrustedProxyGetAPartitionEach(t *testing.T) {
	proxies, err := ParseTrustedProxies("127.48.0.0/16")
	if err != nil {
		t.Fatal(err)
	}
	url := serveLogin(t, proxies)
	for _, who := range []string{"192.0.2.41", "192.0.2.42"} {
		ok, denied := logins(t, url, "127.48.4.2", func(n int) string { return "198.51.100." + itoa(n) + ", " + who })
		if ok != 10 || denied != 5 {
			t.Fatalf("%s: %d allowed, %d denied; want 10 and 5", who, ok, denied)
		}
	}
}
