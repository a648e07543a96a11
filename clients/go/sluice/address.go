package sluice

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Headers a proxy may write the chain of addresses into.
const (
	HeaderXForwardedFor = "X-Forwarded-For"
	HeaderForwarded     = "Forwarded"
)

// TrustedProxies are the proxies in front of the application, for ClientIP: Trusted, the CIDRs
// they connect from (a Unix-socket peer is trusted with TrustUnix), or Hops, how many proxies
// stand in front (the socket peer being the nearest). Header names what they write:
// X-Forwarded-For (the default, "") or Forwarded. The zero value trusts nothing: the socket peer
// is the client, whatever the headers say.
type TrustedProxies struct {
	Trusted   []netip.Prefix
	TrustUnix bool
	Hops      int
	Header    string
}

// ParseTrustedProxies reads CIDRs ("10.0.0.0/8", "::1/128"; "unix" for a Unix-socket peer) into
// TrustedProxies; a bad CIDR is an error.
func ParseTrustedProxies(cidrs ...string) (TrustedProxies, error) {
	var proxies TrustedProxies
	for _, cidr := range cidrs {
		if cidr == "unix" {
			proxies.TrustUnix = true
			continue
		}
		prefix, err := netip.ParsePrefix(cidr)
		if err != nil {
			return TrustedProxies{}, fmt.Errorf("%q is not a CIDR such as 10.0.0.0/8", cidr)
		}
		proxies.Trusted = append(proxies.Trusted, prefix.Masked())
	}
	return proxies, nil
}

// ParseAddress reads an address from a header entry or a peer: 192.0.2.7, 192.0.2.7:4711,
// 2001:db8::1, [2001:db8::1]:4711, "[2001:db8::1]"; an IPv4-mapped IPv6 address as IPv4. The
// second result is false for anything else (unknown, an obfuscated _hidden, garbage).
func ParseAddress(text string) (netip.Addr, bool) {
	text = strings.Trim(strings.TrimSpace(text), `"`)
	if strings.HasPrefix(text, "[") {
		end := strings.Index(text, "]")
		if end < 0 || (len(text) > end+1 && text[end+1] != ':') {
			return netip.Addr{}, false
		}
		text = text[1:end]
	} else if strings.Count(text, ":") == 1 {
		text = text[:strings.Index(text, ":")]
	}
	addr, err := netip.ParseAddr(text)
	if err != nil {
		return netip.Addr{}, false
	}
	return addr.Unmap().WithZone(""), true
}

func (p TrustedProxies) trusts(addr netip.Addr, ok bool) bool {
	if !ok {
		return false
	}
	for _, prefix := range p.Trusted {
		if prefix.Contains(addr) {
			return true
		}
	}
	return false
}

func (p TrustedProxies) chain(headers http.Header) ([]string, error) {
	header := p.Header
	if header == "" {
		header = HeaderXForwardedFor
	}
	value := strings.Join(headers.Values(header), ",")
	if strings.TrimSpace(value) == "" {
		return nil, nil
	}
	var out []string
	switch http.CanonicalHeaderKey(header) {
	case HeaderXForwardedFor:
		for _, entry := range strings.Split(value, ",") {
			out = append(out, strings.TrimSpace(entry))
		}
	case HeaderForwarded:
		for _, element := range strings.Split(value, ",") {
			found := ""
			for _, pair := range strings.Split(element, ";") {
				name, token, ok := strings.Cut(pair, "=")
				if ok && strings.EqualFold(strings.TrimSpace(name), "for") {
					found = strings.TrimSpace(token)
				}
			}
			out = append(out, found)
		}
	default:
		return nil, errors.New("TrustedProxies.Header is X-Forwarded-For or Forwarded")
	}
	return out, nil
}

// ClientAddress is the client's address: the socket peer (remoteAddr, as in r.RemoteAddr)
// unless a trusted proxy is the peer, then the first entry from the right of the proxies' header
// that no trusted proxy vouches for. "" only for a Unix-socket peer nothing vouches for (or a
// bad Header setting).
func (p TrustedProxies) ClientAddress(remoteAddr string, headers http.Header) string {
	peer, ok := ParseAddress(remoteAddr)
	if host, _, err := net.SplitHostPort(remoteAddr); err == nil && !ok {
		peer, ok = ParseAddress(host)
	}
	own := ""
	if ok {
		own = peer.String()
	}
	unixPeer := !ok && (remoteAddr == "" || remoteAddr == "@")
	if !(p.trusts(peer, ok) || p.Hops > 0 || (unixPeer && p.TrustUnix)) {
		return own
	}
	entries, err := p.chain(headers)
	if err != nil {
		return ""
	}
	if p.Hops > 0 {
		if len(entries) == 0 {
			return own
		}
		entry := entries[0]
		if len(entries) >= p.Hops {
			entry = entries[len(entries)-p.Hops]
		}
		if found, ok := ParseAddress(entry); ok {
			return found.String()
		}
		return own
	}
	last := own
	for i := len(entries) - 1; i >= 0; i-- {
		found, ok := ParseAddress(entries[i])
		if !ok {
			break // a trusted proxy passed on something that is not an address: stop at it
		}
		last = found.String()
		if !p.trusts(found, true) {
			return last
		}
	}
	return last
}

// ClientIP is the address of r's client given the proxies in front of the application.
func ClientIP(r *http.Request, proxies TrustedProxies) string {
	return proxies.ClientAddress(r.RemoteAddr, r.Header)
}
