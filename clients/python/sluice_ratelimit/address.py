"""The client's real address behind proxies: `TrustedProxies` walks `X-Forwarded-For` (or
`Forwarded`) from the right, as nginx's `real_ip` and Envoy's `xff_num_trusted_hops` do, and
returns the first address no trusted proxy vouches for. The default trusts nothing: the socket
peer is the client, whatever the headers say."""

import ipaddress
from typing import List, Mapping, Optional, Sequence, Union

_Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
_Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

#: The headers a proxy may write the chain of addresses into.
X_FORWARDED_FOR, FORWARDED = "x-forwarded-for", "forwarded"


def parse_address(text: Optional[str]) -> Optional[_Address]:
    """An IP address from a header entry or a peer: `192.0.2.7`, `192.0.2.7:4711`, `2001:db8::1`,
    `[2001:db8::1]:4711`, `"[2001:db8::1]"`; an IPv4-mapped IPv6 address as its IPv4 address.
    None for anything else (`unknown`, an obfuscated `_hidden`, garbage)."""
    if not text:
        return None
    text = text.strip().strip('"')
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or (text[end + 1:] and not text[end + 1:].startswith(":")):
            return None
        text = text[1:end]
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _forwarded_for(value: str) -> List[str]:
    """The `for=` of each element of a `Forwarded` header (RFC 7239), in order; an element without
    one counts as an unknown hop."""
    out = []
    for element in value.split(","):
        found = ""
        for pair in element.split(";"):
            name, _, token = pair.partition("=")
            if name.strip().lower() == "for":
                found = token.strip()
        out.append(found)
    return out


class TrustedProxies:
    """The proxies in front of the application: `trusted`, CIDRs (`"10.0.0.0/8"`, `"::1/128"`;
    the word `"unix"` for a peer on a Unix socket), or `hops`, how many proxies stand in front
    (the socket peer being the nearest). `header` names what they write: `"x-forwarded-for"`
    (the default) or `"forwarded"`. `TrustedProxies()` trusts nothing."""

    __slots__ = ("networks", "unix", "hops", "header")

    def __init__(self, trusted: Sequence[str] = (), hops: int = 0,
                 header: str = X_FORWARDED_FOR) -> None:
        if isinstance(trusted, str):
            raise TypeError("trusted is a list of CIDRs, not one string")
        if trusted and hops:
            raise ValueError("give trusted CIDRs or a hop count, not both")
        if hops < 0:
            raise ValueError("hops is 0 or more")
        if header not in (X_FORWARDED_FOR, FORWARDED):
            raise ValueError(f"header is {X_FORWARDED_FOR!r} or {FORWARDED!r}, not {header!r}")
        self.unix = "unix" in trusted
        self.networks: List[_Network] = [ipaddress.ip_network(cidr, strict=False)
                                         for cidr in trusted if cidr != "unix"]
        self.hops = hops
        self.header = header

    def _trusts(self, address: Optional[_Address]) -> bool:
        return address is not None and any(address in network for network in self.networks)

    def chain(self, headers: Mapping[str, str]) -> List[str]:
        """The entries of the configured header, nearest proxy's last (repeated headers joined
        with commas, as servers do)."""
        value = headers.get(self.header) or ""
        if not value.strip():
            return []
        if self.header == FORWARDED:
            return _forwarded_for(value)
        return [entry.strip() for entry in value.split(",")]

    def client_address(self, peer: Optional[str], headers: Mapping[str, str]) -> Optional[str]:
        """The client's address: the socket `peer` unless a trusted proxy is the peer, then the
        first entry from the right of the header that no trusted proxy vouches for. `headers`
        maps lower-case names to values. None only for a Unix-socket peer nothing vouches for."""
        at = parse_address(peer)
        trusted_peer = (at is None and self.unix and not peer) or self._trusts(at) or self.hops > 0
        if not trusted_peer:
            return str(at) if at is not None else None
        chain = self.chain(headers)
        if self.hops:
            # `hops` proxies each appended the address they saw: the client is hops-th from the right.
            if not chain:
                return str(at) if at is not None else None
            entry = chain[-self.hops] if len(chain) >= self.hops else chain[0]
            found = parse_address(entry)
            return str(found) if found is not None else (str(at) if at is not None else None)
        last = at
        for entry in reversed(chain):
            found = parse_address(entry)
            if found is None:
                break  # a trusted proxy wrote something that is not an address: stop at it
            last = found
            if not self._trusts(found):
                return str(found)
        return str(last) if last is not None else None
