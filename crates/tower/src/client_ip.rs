//! The client's address, as a limit keys it: believed only as far as the gateway's operator
//! says its proxies vouch for it.
//!
//! Envoy, nginx and cloud load balancers append to `X-Forwarded-For` and pass a client's own
//! `Forwarded` through untouched (and the other way round for some): reading whichever header
//! is present lets a client write its own address. So the operator names the one header their
//! proxy writes, and who may write it: proxies whose addresses it knows (the rightmost address
//! that is not one of them is the client), or a number of hops in front of every request
//! (cloud load balancers whose addresses change: the client is that many from the right). The
//! other header is never read. IPv6 addresses are counted per prefix (a /64 by default): a
//! client holding a /64 has 2^64 addresses, one counter each otherwise.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use http::{HeaderMap, Request};
use ipnet::{IpNet, Ipv6Net};

/// The address the connection came from, for servers other than axum's `ConnectInfo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// The header a trusted proxy writes the client's address to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (Envoy, nginx, most load balancers).
    XForwardedFor,
    /// `Forwarded: for=client, for=proxy1` (RFC 7239).
    Forwarded,
}

/// Who may say where a request came from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Trust {
    /// Nobody: the connection's own address.
    Nobody,
    /// Proxies at these addresses: the header is read when the connection comes from one,
    /// and believed up to the first address, from the right, that is not one.
    Proxies(Vec<IpNet>),
    /// This many proxies in front of every request: the client is that many from the right.
    Hops(usize),
}

/// How the client's address is found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIp {
    header: ForwardedHeader,
    trust: Trust,
    ipv6_prefix: u8,
}

/// The IPv6 prefix a client is counted by unless told otherwise.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

impl ClientIp {
    /// The connection's own address: no proxy in front of the gateway.
    pub fn direct() -> Self {
        Self {
            header: ForwardedHeader::XForwardedFor,
            trust: Trust::Nobody,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Behind proxies at `trusted_proxies` (CIDRs or addresses) that write `header`.
    ///
    /// # Panics
    /// When a trusted proxy is not a CIDR or an address (a programming error).
    pub fn behind_proxies<S: AsRef<str>>(
        header: ForwardedHeader,
        trusted_proxies: impl IntoIterator<Item = S>,
    ) -> Self {
        let trusted = trusted_proxies
            .into_iter()
            .map(|p| {
                let p = p.as_ref();
                p.parse::<IpNet>()
                    .or_else(|_| p.parse::<IpAddr>().map(IpNet::from))
                    .unwrap_or_else(|_| panic!("{p:?} is not a CIDR or an address"))
            })
            .collect();
        Self {
            header,
            trust: Trust::Proxies(trusted),
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Behind exactly `hops` proxies that each append to `header` (a load balancer whose
    /// addresses are not known in advance: 1). A request with fewer entries than that did
    /// not come through them, and is keyed by its connection's address.
    pub fn behind_hops(header: ForwardedHeader, hops: usize) -> Self {
        Self {
            header,
            trust: Trust::Hops(hops.max(1)),
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Counts IPv6 clients per prefix of `bits` (128: per address).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.clamp(1, 128);
        self
    }

    /// The client's address (before grouping), when the connection's address is known.
    pub fn address_of<B>(&self, request: &Request<B>) -> Option<IpAddr> {
        let peer = peer_of(request)?;
        Some(match &self.trust {
            Trust::Nobody => peer,
            Trust::Proxies(trusted) => {
                let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
                if !is_trusted(&peer) {
                    return Some(peer);
                }
                let mut client = peer;
                for ip in chain(request.headers(), self.header).iter().rev() {
                    client = *ip;
                    if !is_trusted(ip) {
                        break;
                    }
                }
                client
            }
            Trust::Hops(hops) => {
                let chain = chain(request.headers(), self.header);
                match chain.len().checked_sub(*hops) {
                    Some(at) => chain[at],
                    None => peer,
                }
            }
        })
    }

    /// What the `ip` descriptor entry holds: an IPv4 address, or the IPv6 prefix the
    /// address is in (`2001:db8:1:2::/64`; an IPv4-mapped one reads as IPv4).
    pub fn key_of<B>(&self, request: &Request<B>) -> Option<String> {
        Some(self.key(self.address_of(request)?))
    }

    fn key(&self, ip: IpAddr) -> String {
        match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => v4.to_string(),
                None if self.ipv6_prefix >= 128 => v6.to_string(),
                None => Ipv6Net::new(v6, self.ipv6_prefix)
                    .map(|net| net.trunc().to_string())
                    .unwrap_or_else(|_| Ipv6Addr::UNSPECIFIED.to_string()),
            },
        }
    }
}

/// The address the connection came from.
fn peer_of<B>(request: &Request<B>) -> Option<IpAddr> {
    request
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
        .or_else(|| request.extensions().get::<PeerAddr>().map(|p| p.0.ip()))
}

/// The forwarding chain of `header` only, client first. An entry that is not an address
/// (`unknown`, an obfuscated name) ends the chain there: nothing left of it can be believed.
fn chain(headers: &HeaderMap, header: ForwardedHeader) -> Vec<IpAddr> {
    let raw: Vec<&str> = match header {
        ForwardedHeader::Forwarded => headers
            .get_all(http::header::FORWARDED)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|element| {
                element.split(';').find_map(|pair| {
                    let (k, v) = pair.trim().split_once('=')?;
                    k.eq_ignore_ascii_case("for").then_some(v.trim())
                })
            })
            .collect(),
        ForwardedHeader::XForwardedFor => headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect(),
    };
    let mut chain = vec![];
    for entry in raw.iter().rev() {
        match parse_node(entry) {
            Some(ip) => chain.push(ip),
            None => break,
        }
    }
    chain.reverse();
    chain
}

/// An address from a forwarding entry: `1.2.3.4`, `1.2.3.4:80`, `"[2001:db8::1]:80"`,
/// `2001:db8::1`.
fn parse_node(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim().trim_matches('"');
    if let Ok(ip) = entry.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = entry.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    entry
        .strip_prefix('[')
        .and_then(|rest| rest.split_once(']'))
        .and_then(|(ip, _)| ip.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(peer: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::builder().uri("/login");
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let mut request = builder.body(()).expect("request");
        request
            .extensions_mut()
            .insert(PeerAddr(peer.parse().expect("peer")));
        request
    }

    fn key(how: &ClientIp, peer: &str, headers: &[(&str, &str)]) -> String {
        how.key_of(&request(peer, headers)).expect("an address")
    }

    #[test]
    fn forwarding_headers_count_only_through_trusted_proxies() {
        let xff = ClientIp::behind_proxies(ForwardedHeader::XForwardedFor, ["10.0.0.0/8"]);
        // A client that is not a trusted proxy cannot name another address.
        assert_eq!(
            key(
                &xff,
                "203.0.113.9:4000",
                &[("x-forwarded-for", "198.51.100.1")]
            ),
            "203.0.113.9"
        );
        // Through a trusted proxy: the rightmost untrusted address.
        assert_eq!(
            key(
                &xff,
                "10.0.0.2:4000",
                &[("x-forwarded-for", "198.51.100.7, 203.0.113.5, 10.0.0.3")]
            ),
            "203.0.113.5",
            "a client-supplied address left of the first untrusted hop is not believed"
        );
        assert_eq!(
            key(
                &xff,
                "10.0.0.2:4000",
                &[("x-forwarded-for", "garbage, 10.0.0.9")]
            ),
            "10.0.0.9",
            "an entry that is no address ends what can be believed"
        );
        assert_eq!(key(&xff, "10.0.0.2:4000", &[]), "10.0.0.2");
    }

    #[test]
    fn only_the_header_the_proxy_writes_is_read() {
        // Envoy appends to X-Forwarded-For and passes the client's Forwarded untouched.
        let xff = ClientIp::behind_proxies(ForwardedHeader::XForwardedFor, ["10.0.0.0/8"]);
        let forged = [
            ("forwarded", "for=198.51.100.77"),
            ("x-forwarded-for", "203.0.113.5"),
        ];
        assert_eq!(key(&xff, "10.0.0.2:1", &forged), "203.0.113.5");
        // A proxy that writes Forwarded: X-Forwarded-For is the client's, and ignored.
        let rfc = ClientIp::behind_proxies(ForwardedHeader::Forwarded, ["10.0.0.0/8"]);
        let headers = [
            ("x-forwarded-for", "198.51.100.77"),
            ("forwarded", "for=\"[2001:db8::1]:443\";proto=https"),
        ];
        assert_eq!(key(&rfc, "10.0.0.2:1", &headers), "2001:db8::/64");
    }

    #[test]
    fn a_number_of_hops_takes_the_address_that_many_from_the_right() {
        let one = ClientIp::behind_hops(ForwardedHeader::XForwardedFor, 1);
        // The load balancer appended the real address; the client prepended its own.
        assert_eq!(
            key(
                &one,
                "35.1.2.3:1",
                &[("x-forwarded-for", "1.1.1.1, 203.0.113.5")]
            ),
            "203.0.113.5"
        );
        let two = ClientIp::behind_hops(ForwardedHeader::XForwardedFor, 2);
        assert_eq!(
            key(
                &two,
                "35.1.2.3:1",
                &[("x-forwarded-for", "1.1.1.1, 203.0.113.5, 10.9.9.9")]
            ),
            "203.0.113.5"
        );
        // Fewer entries than hops: it did not come through them; the connection decides.
        assert_eq!(
            key(&two, "35.1.2.3:1", &[("x-forwarded-for", "1.1.1.1")]),
            "35.1.2.3"
        );
    }

    #[test]
    fn ipv6_clients_are_counted_per_prefix() {
        let direct = ClientIp::direct();
        assert_eq!(
            key(&direct, "[2001:db8:1:2:3:4:5:6]:9", &[]),
            "2001:db8:1:2::/64"
        );
        assert_eq!(
            key(&direct, "[2001:db8:1:2:ffff::1]:9", &[]),
            "2001:db8:1:2::/64",
            "one /64, one counter"
        );
        assert_eq!(key(&direct, "[::ffff:192.0.2.7]:9", &[]), "192.0.2.7");
        assert_eq!(
            key(&direct.clone().ipv6_prefix(128), "[2001:db8::9]:9", &[]),
            "2001:db8::9"
        );
        assert_eq!(
            key(&direct.ipv6_prefix(48), "[2001:db8:1:2::9]:9", &[]),
            "2001:db8:1::/48"
        );
    }
}
