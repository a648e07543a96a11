"""TrustedProxies: the client's address from the socket peer and the proxies' header, walked from
the right; a client's own entries never count unless a trusted proxy vouches for them."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sluice_ratelimit import Request, TrustedProxies  # noqa: E402
from sluice_ratelimit.address import parse_address  # noqa: E402


def xff(value):
    return {"x-forwarded-for": value}


class AddressTest(unittest.TestCase):
    def test_trusting_nothing_the_peer_is_the_client_whatever_the_header(self):
        proxies = TrustedProxies()
        seen = {proxies.client_address("198.51.100.9", xff(f"203.0.113.{n}")) for n in range(20)}
        self.assertEqual(seen, {"198.51.100.9"})
        self.assertEqual(Request("GET", "/", "", xff("1.2.3.4"), "198.51.100.9", None).client_address(),
                         "198.51.100.9")

    def test_behind_a_trusted_proxy_the_rightmost_untrusted_entry_is_the_client(self):
        proxies = TrustedProxies(["10.0.0.0/8"])
        # The client wrote "1.1.1.1"; the proxy appended what it saw.
        self.assertEqual(proxies.client_address("10.0.0.5", xff("1.1.1.1, 203.0.113.7")), "203.0.113.7")
        # Two trusted proxies in a row.
        self.assertEqual(proxies.client_address("10.0.0.5", xff("1.1.1.1, 203.0.113.7, 10.1.2.3")),
                         "203.0.113.7")
        # A peer outside the trusted set: its header is the client's own, ignored.
        self.assertEqual(proxies.client_address("198.51.100.1", xff("203.0.113.7")), "198.51.100.1")
        # No header from a trusted proxy: the proxy itself.
        self.assertEqual(proxies.client_address("10.0.0.5", {}), "10.0.0.5")
        # Garbage a trusted proxy passed on stops the walk at the last good address.
        self.assertEqual(proxies.client_address("10.0.0.5", xff("junk, 10.9.9.9")), "10.9.9.9")

    def test_a_hop_count_takes_the_nth_entry_from_the_right(self):
        one, two = TrustedProxies(hops=1), TrustedProxies(hops=2)
        self.assertEqual(one.client_address("192.0.2.1", xff("1.1.1.1, 203.0.113.7")), "203.0.113.7")
        self.assertEqual(two.client_address("192.0.2.1", xff("1.1.1.1, 203.0.113.7, 192.0.2.9")),
                         "203.0.113.7")
        self.assertEqual(two.client_address("192.0.2.1", xff("203.0.113.7")), "203.0.113.7")
        self.assertEqual(one.client_address("192.0.2.1", {}), "192.0.2.1")

    def test_forwarded_ports_brackets_and_mapped_addresses(self):
        proxies = TrustedProxies(["127.0.0.1/32", "::1/128"], header="forwarded")
        header = {"forwarded": 'for=1.1.1.1, for="[2001:db8::7]:4711";proto=https;by=10.0.0.1'}
        self.assertEqual(proxies.client_address("::1", header), "2001:db8::7")
        self.assertEqual(proxies.client_address("::ffff:127.0.0.1", {"forwarded": "for=192.0.2.60:80"}),
                         "192.0.2.60")
        self.assertEqual(proxies.client_address("127.0.0.1", {"forwarded": "for=unknown"}), "127.0.0.1")
        self.assertEqual(str(parse_address("[::1]:80")), "::1")
        self.assertEqual(str(parse_address("192.0.2.1:8080")), "192.0.2.1")
        self.assertIsNone(parse_address("_hidden"))
        # A Unix-socket peer counts as a proxy only when said.
        self.assertEqual(TrustedProxies(["unix"]).client_address(None, xff("203.0.113.7")), "203.0.113.7")
        self.assertIsNone(TrustedProxies().client_address(None, xff("203.0.113.7")))

    def test_bad_settings_are_refused(self):
        with self.assertRaises(TypeError):
            TrustedProxies("10.0.0.0/8")
        with self.assertRaises(ValueError):
            TrustedProxies(["10.0.0.0/8"], hops=1)
        with self.assertRaises(ValueError):
            TrustedProxies(["not a network"])
        with self.assertRaises(ValueError):
            TrustedProxies(header="x-real-ip")


if __name__ == "__main__":
    unittest.main()
