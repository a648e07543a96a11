//! `listen.local_peers`: which admin clients count as local (they see raw partitions in
//! `/v1/top` and, with `listen.admin_resets = "loopback"`, may reset counters). By default only
//! `127.0.0.1` and `::1`: a service mesh's sidecar reaches the pod's ports from other
//! `127.0.0.0/8` addresses on behalf of remote peers (Istio's REDIRECT mode: `127.0.0.6`), so
//! the rest of `127.0.0.0/8` is local only if an operator lists it.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An address block `ADDR/PREFIX` (a bare address is `/32` or `/128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerNet {
    addr: IpAddr,
    prefix: u8,
}

impl PeerNet {
    /// Whether `ip` (an IPv4-mapped IPv6 address counts as its IPv4 address) is in the block.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                same_prefix(u32::from(net).into(), u32::from(ip).into(), 32, self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                same_prefix(u128::from(net), u128::from(ip), 128, self.prefix)
            }
            _ => false,
        }
    }
}

/// Whether `a` and `b` (numbers of `bits` bits) agree on their first `prefix` bits.
fn same_prefix(a: u128, b: u128, bits: u8, prefix: u8) -> bool {
    let ignored = u32::from(bits - prefix);
    a.checked_shr(ignored).unwrap_or(0) == b.checked_shr(ignored).unwrap_or(0)
}

impl FromStr for PeerNet {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || {
            format!("{text:?} is not an address or a block such as \"127.0.0.1\" or \"10.0.0.0/8\"")
        };
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let addr: IpAddr = addr.trim().parse().map_err(|_| bad())?;
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= bits)
                .ok_or_else(bad)?,
        };
        match addr.to_canonical() {
            // `::ffff:a.b.c.d/p` is the IPv4 block `a.b.c.d/(p - 96)`.
            IpAddr::V4(v4) if addr.is_ipv6() => Ok(Self {
                addr: IpAddr::V4(v4),
                prefix: prefix.checked_sub(96).ok_or_else(bad)?,
            }),
            addr => Ok(Self { addr, prefix }),
        }
    }
}

impl fmt::Display for PeerNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// The admin clients that count as local; parsed once, at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalPeers(Vec<PeerNet>);

impl LocalPeers {
    /// Whether a client at `ip` is local.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|net| net.contains(ip))
    }
}

impl Default for LocalPeers {
    /// `127.0.0.1` and `::1`, nothing else of `127.0.0.0/8`.
    fn default() -> Self {
        Self(vec![
            PeerNet {
                addr: IpAddr::from([127, 0, 0, 1]),
                prefix: 32,
            },
            PeerNet {
                addr: IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
                prefix: 128,
            },
        ])
    }
}

impl Serialize for LocalPeers {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(ToString::to_string))
    }
}

impl<'de> Deserialize<'de> for LocalPeers {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let texts = Vec::<String>::deserialize(deserializer)?;
        texts
            .iter()
            .map(|t| t.parse().map_err(serde::de::Error::custom))
            .collect::<Result<Vec<PeerNet>, _>>()
            .map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("ip")
    }

    #[test]
    fn by_default_only_127_0_0_1_and_ipv6_loopback_are_local() {
        let local = LocalPeers::default();
        for yes in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
            assert!(local.contains(ip(yes)), "{yes}");
        }
        for no in [
            "127.0.0.6",
            "127.0.0.2",
            "10.0.0.1",
            "::2",
            "::ffff:127.0.0.6",
        ] {
            assert!(!local.contains(ip(no)), "{no}");
        }
    }

    #[test]
    fn an_operator_widens_it_with_blocks() {
        let nets: Vec<PeerNet> = ["127.0.0.0/8", "fd00::/8", "10.1.2.3"]
            .iter()
            .map(|t| t.parse().expect("net"))
            .collect();
        let local = LocalPeers(nets);
        for yes in [
            "127.0.0.6",
            "127.255.0.1",
            "fd12::1",
            "10.1.2.3",
            "::ffff:127.0.0.6",
        ] {
            assert!(local.contains(ip(yes)), "{yes}");
        }
        for no in ["128.0.0.1", "fe80::1", "10.1.2.4", "::1"] {
            assert!(!local.contains(ip(no)), "{no}");
        }
        let all: PeerNet = "0.0.0.0/0".parse().expect("net");
        assert!(all.contains(ip("203.0.113.7")));
        for bad in ["127.0.0.0/33", "localhost", "::1/129", "1.2.3.4/x", ""] {
            assert!(bad.parse::<PeerNet>().is_err(), "{bad}");
        }
    }
}
