//! What a `callback_url` may reach: the entries of a webhook allow-list
//! (`[webhooks] allow`, `[tenants.<name>.webhooks] allow`), the addresses
//! that no entry naming a host opens (loopback, private, link-local, cloud
//! metadata and the like), and the check of a URL against them. The check
//! is made when a call names the URL and again before each delivery
//! attempt, and the attempt connects only to the addresses it passed.
//!
//! An entry is a host and its ports: `hooks.example.com` (ports 80 and
//! 443), `hooks.example.com:8443`, `hooks.example.com:*` (any port), an
//! address (`203.0.113.7`, `[2001:db8::7]:8443`) or a network
//! (`10.0.0.0/8:*`, `[fd00::/8]:443`). A URL naming a host is allowed on
//! an entry naming that host and port, and only at the public addresses
//! the name resolves to, or at a special one inside an entry's address or
//! network for that port. A URL naming an address is allowed on an entry
//! whose address or network holds it. This module must never widen an
//! entry: a name that comes to resolve somewhere new (DNS rebinding)
//! reaches nothing the operator did not name.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use reqwest::Url;
use toolfleet_core::registry::truncate;

/// The ports of an allow-list entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ports {
    /// No port named: the web's, 80 and 443.
    Web,
    /// `host:port`.
    One(u16),
    /// `host:*`.
    Any,
}

impl Ports {
    /// True when a URL connecting to `port` may use the entry.
    pub fn allows(self, port: u16) -> bool {
        match self {
            Ports::Web => port == 80 || port == 443,
            Ports::One(one) => port == one,
            Ports::Any => true,
        }
    }

    fn parse(text: &str, entry: &str) -> Result<Ports, String> {
        if text == "*" {
            return Ok(Ports::Any);
        }
        match text.parse::<u16>() {
            Ok(port) if port > 0 && text.chars().all(|c| c.is_ascii_digit()) => {
                Ok(Ports::One(port))
            }
            _ => Err(format!(
                "webhook allow entry `{entry}`: `{text}` is not a port: write a port from 1 to 65535, or `*` for any port"
            )),
        }
    }
}

impl fmt::Display for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ports::Web => f.write_str("ports 80 and 443"),
            Ports::One(port) => write!(f, "port {port}"),
            Ports::Any => f.write_str("any port"),
        }
    }
}

/// An address (a network of one) or a network: `addr/prefix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    /// The network of the single address `addr`.
    pub fn single(addr: IpAddr) -> Network {
        let addr = addr.to_canonical();
        Network {
            addr,
            prefix: bits(addr),
        }
    }

    /// True when `ip` is inside: an IPv4-mapped IPv6 address is its IPv4
    /// address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.addr.is_ipv4() && masked(ip, self.prefix) == self.first()
    }

    fn parse(text: &str, entry: &str) -> Result<Network, String> {
        let Some((addr, prefix)) = text.split_once('/') else {
            let addr = text.parse::<IpAddr>().map_err(|_| {
                format!("webhook allow entry `{entry}`: `{text}` is not an IP address")
            })?;
            return Ok(Network::single(addr));
        };
        let addr = addr.parse::<IpAddr>().map_err(|_| {
            format!("webhook allow entry `{entry}`: `{addr}` is not the IP address of a network")
        })?;
        let prefix = prefix
            .parse::<u8>()
            .ok()
            .filter(|p| *p <= bits(addr) && prefix.chars().all(|c| c.is_ascii_digit()))
            .ok_or_else(|| {
                format!(
                    "webhook allow entry `{entry}`: `/{prefix}` is not a prefix length of 0 to {}",
                    bits(addr)
                )
            })?;
        // An IPv4-mapped network is the IPv4 network it maps.
        let (addr, prefix) = match addr {
            IpAddr::V6(v6) if prefix >= 96 && v6.to_ipv4_mapped().is_some() => {
                (addr.to_canonical(), prefix - 96)
            }
            _ => (addr, prefix),
        };
        let network = Network { addr, prefix };
        if network.first() != addr {
            return Err(format!(
                "webhook allow entry `{entry}`: `{text}` names an address inside a network, not the network: write `{}/{prefix}`",
                network.first()
            ));
        }
        Ok(network)
    }

    /// The network's first address.
    fn first(&self) -> IpAddr {
        masked(self.addr, self.prefix)
    }
}

/// `ip` with all but its first `prefix` bits cleared (a prefix of 0 clears
/// them all).
fn masked(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(ip) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(ip) & mask))
        }
        IpAddr::V6(ip) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(ip) & mask))
        }
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix == bits(self.addr) {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.prefix)
        }
    }
}

/// The length of an address of `addr`'s family, in bits.
fn bits(addr: IpAddr) -> u8 {
    if addr.is_ipv4() { 32 } else { 128 }
}

/// What an entry names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// A host name, lowercase, without a trailing dot.
    Name(String),
    /// An address or a network.
    Network(Network),
}

/// One entry of a webhook allow-list, parsed from its text (see the
/// module's documentation); its `Display` is the canonical text.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "String")]
pub struct AllowRule {
    target: Target,
    ports: Ports,
}

impl AllowRule {
    /// True when the entry's address or network holds `ip` on `port`.
    fn holds(&self, ip: IpAddr, port: u16) -> bool {
        matches!(&self.target, Target::Network(net) if net.contains(ip)) && self.ports.allows(port)
    }

    /// The ports of the entry, when it names the host `host`.
    fn ports_of(&self, host: &Host) -> Option<Ports> {
        let named = match (&self.target, host) {
            (Target::Name(own), Host::Name(name)) => own == name,
            (Target::Network(net), Host::Address(ip)) => net.contains(*ip),
            _ => false,
        };
        named.then_some(self.ports)
    }
}

impl FromStr for AllowRule {
    type Err = String;

    fn from_str(entry: &str) -> Result<AllowRule, String> {
        let text = entry.trim();
        if text.is_empty() {
            return Err(
                "a webhook allow entry is empty: name a host, `host:port` or `host:*`".into(),
            );
        }
        if !text.is_ascii() {
            return Err(format!(
                "webhook allow entry `{entry}`: host names must be ASCII; write an internationalised name in its IDNA form (`xn--...`)"
            ));
        }
        if text.contains("://") || text.contains(['@', '?', '#']) {
            return Err(format!(
                "webhook allow entry `{entry}` is a URL: an entry names a host and its ports, as `hooks.example.com`, `hooks.example.com:8443` or `hooks.example.com:*`"
            ));
        }
        let (host, port, bracketed) = split_port(text, entry)?;
        let ports = match port {
            None => Ports::Web,
            Some(port) => Ports::parse(port, entry)?,
        };
        let looks_like_address = bracketed
            || host.contains(':')
            || host.contains('/')
            || host.chars().all(|c| c.is_ascii_digit() || c == '.');
        let target = if looks_like_address {
            Target::Network(Network::parse(host, entry)?)
        } else {
            Target::Name(host_name(host, entry)?)
        };
        Ok(AllowRule { target, ports })
    }
}

/// The host and port of an entry (`host`, `host:port`, `[v6]`,
/// `[v6]:port`, or a bare IPv6 address or network, without a port), and
/// whether the host was in brackets.
fn split_port<'a>(text: &'a str, entry: &str) -> Result<(&'a str, Option<&'a str>, bool), String> {
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("webhook allow entry `{entry}`: `[` without its `]`"))?;
        return match after {
            "" => Ok((host, None, true)),
            _ => match after.strip_prefix(':') {
                Some(port) => Ok((host, Some(port), true)),
                None => Err(format!(
                    "webhook allow entry `{entry}`: after `]` comes `:port`, `:*` or nothing"
                )),
            },
        };
    }
    match text.matches(':').count() {
        0 => Ok((text, None, false)),
        1 => Ok(text
            .split_once(':')
            .map_or((text, None, false), |(h, p)| (h, Some(p), false))),
        // Several colons: an IPv6 address or network, whose port needs brackets.
        _ => match Network::parse(text, entry) {
            Ok(_) => Ok((text, None, false)),
            // An IPv6 network with a bad prefix: say what is wrong with it.
            Err(error)
                if text
                    .split('/')
                    .next()
                    .is_some_and(|a| a.parse::<Ipv6Addr>().is_ok()) =>
            {
                Err(error)
            }
            Err(_) => Err(format!(
                "webhook allow entry `{entry}` is not an IPv6 address or network (an IPv6 address with a port is written in brackets: `[fd00::1]:8443`, `[fd00::/8]:*`)"
            )),
        },
    }
}

/// A host name of an entry, normalised: lowercase, without a trailing dot.
fn host_name(host: &str, entry: &str) -> Result<String, String> {
    let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    if name.contains('*') {
        return Err(format!(
            "webhook allow entry `{entry}`: wildcards are not taken; name each host"
        ));
    }
    let label_ok = |label: &str| {
        (1..=63).contains(&label.len())
            && label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(format!(
            "webhook allow entry `{entry}`: `{host}` is not a host name (labels of 1 to 63 letters, digits, `-` or `_`, separated by dots)"
        ));
    }
    Ok(name)
}

impl TryFrom<String> for AllowRule {
    type Error = String;

    fn try_from(value: String) -> Result<Self, String> {
        value.parse()
    }
}

impl fmt::Display for AllowRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let port = match self.ports {
            Ports::Web => String::new(),
            Ports::One(port) => format!(":{port}"),
            Ports::Any => ":*".to_owned(),
        };
        match &self.target {
            Target::Name(name) => write!(f, "{name}{port}"),
            Target::Network(net) if net.addr.is_ipv6() && !port.is_empty() => {
                write!(f, "[{net}]{port}")
            }
            Target::Network(net) => write!(f, "{net}{port}"),
        }
    }
}

/// Why an address is special: no entry naming a host opens it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    /// 0.0.0.0/8, `::`: on most systems, this machine.
    Unspecified,
    /// 127.0.0.0/8, `::1`.
    Loopback,
    /// 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, fc00::/7 (fd00::/8), fec0::/10.
    Private,
    /// 100.64.0.0/10, carrier-grade NAT.
    SharedNat,
    /// 169.254.0.0/16, fe80::/10.
    LinkLocal,
    /// A cloud's metadata service: 169.254.169.254, fd00:ec2::254,
    /// 100.100.100.200, 168.63.129.16.
    Metadata,
    /// 224.0.0.0/4, ff00::/8.
    Multicast,
    /// Documentation, benchmarking, reserved, broadcast and transition
    /// ranges that no public receiver uses.
    Reserved,
}

impl Special {
    /// How a message names the class.
    pub fn describe(self) -> &'static str {
        match self {
            Special::Unspecified => "unspecified",
            Special::Loopback => "loopback",
            Special::Private => "private",
            Special::SharedNat => "carrier-grade NAT",
            Special::LinkLocal => "link-local",
            Special::Metadata => "cloud metadata",
            Special::Multicast => "multicast",
            Special::Reserved => "reserved",
        }
    }
}

/// The special class of `ip`, or `None` for a public address. An IPv6
/// address carrying an IPv4 one (mapped, NAT64, 6to4) is the class of the
/// IPv4 address.
pub fn special(ip: IpAddr) -> Option<Special> {
    match ip {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => special_v6(v6),
    }
}

fn special_v4(ip: Ipv4Addr) -> Option<Special> {
    let [a, b, c, d] = ip.octets();
    let class = match (a, b, c) {
        _ if [a, b, c, d] == [169, 254, 169, 254]
            || [a, b, c, d] == [100, 100, 100, 200]
            || [a, b, c, d] == [168, 63, 129, 16] =>
        {
            Special::Metadata
        }
        (0, _, _) => Special::Unspecified,
        (127, _, _) => Special::Loopback,
        (10, _, _) | (192, 168, _) => Special::Private,
        (172, 16..=31, _) => Special::Private,
        (100, 64..=127, _) => Special::SharedNat,
        (169, 254, _) => Special::LinkLocal,
        (224..=239, _, _) => Special::Multicast,
        (240..=255, _, _) => Special::Reserved,
        (192, 0, 0) | (192, 0, 2) | (192, 88, 99) | (198, 51, 100) | (203, 0, 113) => {
            Special::Reserved
        }
        (198, 18..=19, _) => Special::Reserved,
        _ => return None,
    };
    Some(class)
}

fn special_v6(ip: Ipv6Addr) -> Option<Special> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return special_v4(v4);
    }
    let s = ip.segments();
    let embedded = |high: u16, low: u16| {
        let [a, b] = high.to_be_bytes();
        let [c, d] = low.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    let class = match s {
        [0, 0, 0, 0, 0, 0, 0, 0] => Special::Unspecified,
        [0, 0, 0, 0, 0, 0, 0, 1] => Special::Loopback,
        [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254] => Special::Metadata,
        // NAT64's well-known prefix and 6to4 reach the IPv4 address they carry.
        [0x64, 0xff9b, 0, 0, 0, 0, high, low] => return special_v4(embedded(high, low)),
        [0x2002, high, low, ..] => return special_v4(embedded(high, low)),
        // IPv4-compatible (deprecated), local-use NAT64, discard-only, Teredo,
        // documentation.
        [0, 0, 0, 0, 0, 0, _, _] => Special::Reserved,
        [0x64, 0xff9b, 1, ..] => Special::Reserved,
        [0x100, 0, 0, 0, ..] => Special::Reserved,
        [0x2001, 0, ..] | [0x2001, 0xdb8, ..] => Special::Reserved,
        [0x3fff, second, ..] if second < 0x1000 => Special::Reserved,
        [first, ..] if first & 0xfe00 == 0xfc00 => Special::Private,
        [first, ..] if first & 0xffc0 == 0xfe80 => Special::LinkLocal,
        [first, ..] if first & 0xffc0 == 0xfec0 => Special::Private,
        [first, ..] if first & 0xff00 == 0xff00 => Special::Multicast,
        _ => return None,
    };
    Some(class)
}

/// The host a callback URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    /// A name, lowercase, without a trailing dot.
    Name(String),
    /// An address (an IPv4-mapped one as its IPv4 address).
    Address(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Address(IpAddr::V6(v6)) => write!(f, "[{v6}]"),
            Host::Address(ip) => write!(f, "{ip}"),
        }
    }
}

/// A `callback_url`, read: where it connects, before any check.
#[derive(Debug, Clone)]
pub struct Callback {
    url: Url,
    host: Host,
    port: u16,
}

/// Why a callback URL may not be used now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Not a URL toolfleet sends to, or a rule of the allow-list refuses
    /// it: a message saying which and how to allow it.
    Refused(String),
    /// Its host name did not resolve (a failure that may pass).
    Unresolved(String),
}

impl Refusal {
    /// The message, for a caller or a log line.
    pub fn message(&self) -> &str {
        match self {
            Refusal::Refused(message) | Refusal::Unresolved(message) => message,
        }
    }
}

/// Where a delivery attempt may connect: the URL and the addresses that
/// passed the allow-list, to which its host is pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// Where to deliver.
    pub url: Url,
    /// The URL's host name as the HTTP client reads it, when it names one
    /// (an address is connected to as it is).
    pub name: Option<String>,
    /// The checked addresses, in the order the name resolved to them.
    pub addrs: Vec<SocketAddr>,
}

/// How long resolving a callback's host name may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

impl Callback {
    /// Reads `text` as an http or https URL with a host.
    pub fn parse(text: &str) -> Result<Callback, Refusal> {
        let refused = |message: String| Refusal::Refused(message);
        if !text.is_ascii() {
            return Err(refused(
                "callback_url must be ASCII: write its host name in its IDNA form (`xn--...`) and percent-encode the rest".into(),
            ));
        }
        let url = Url::parse(text).map_err(|e| {
            refused(format!(
                "callback_url `{}` is not a URL ({e})",
                truncate(text, 128)
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(refused("callback_url must be an http or https URL".into()));
        }
        let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
            return Err(refused(format!(
                "callback_url `{}` names no host",
                truncate(text, 128)
            )));
        };
        // The URL parser writes an IPv4 address in dotted decimal (whatever
        // form it was given in) and an IPv6 address in brackets.
        let host = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            let v6 = v6.parse::<Ipv6Addr>().map_err(|_| {
                refused(format!("callback_url host `{host}` is not an IPv6 address"))
            })?;
            Host::Address(IpAddr::V6(v6).to_canonical())
        } else if let Ok(v4) = host.parse::<Ipv4Addr>() {
            Host::Address(IpAddr::V4(v4))
        } else {
            Host::Name(host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase())
        };
        Ok(Callback { url, host, port })
    }

    /// Refuses the URL unless an entry of `allow` names its host and port;
    /// no name is resolved.
    pub fn admitted(&self, allow: &[AllowRule]) -> Result<(), Refusal> {
        let (host, port) = (&self.host, self.port);
        let ports: Vec<Ports> = allow
            .iter()
            .filter_map(|rule| rule.ports_of(host))
            .collect();
        if ports.iter().any(|p| p.allows(port)) {
            return Ok(());
        }
        let message = if ports.is_empty() {
            format!(
                "callback_url host `{host}` is not in the webhook allow-list: an entry `{host}` (ports 80 and 443), `{host}:{port}` or `{host}:*` allows it"
            )
        } else {
            let named: Vec<String> = ports.iter().map(Ports::to_string).collect();
            format!(
                "callback_url `{host}:{port}`: the webhook allow-list names `{host}` for {} only, not port {port}: an entry `{host}:{port}` or `{host}:*` allows it",
                named.join(", ")
            )
        };
        Err(Refusal::Refused(message))
    }

    /// The destination of the URL once `resolved` (the addresses its host
    /// resolves to) is screened by `allow`: every public address, and each
    /// special one inside an entry's address or network for the URL's
    /// port. Refused when none is left. [`Callback::admitted`] must have
    /// passed.
    pub fn pin(&self, allow: &[AllowRule], resolved: &[IpAddr]) -> Result<Destination, Refusal> {
        let mut addrs: Vec<SocketAddr> = Vec::new();
        let mut refused: Vec<(IpAddr, Special)> = Vec::new();
        for ip in resolved.iter().map(|ip| ip.to_canonical()) {
            match special(ip) {
                Some(class) if !allow.iter().any(|rule| rule.holds(ip, self.port)) => {
                    if !refused.iter().any(|(seen, _)| *seen == ip) {
                        refused.push((ip, class));
                    }
                }
                _ => {
                    let addr = SocketAddr::new(ip, self.port);
                    if !addrs.contains(&addr) {
                        addrs.push(addr);
                    }
                }
            }
        }
        if addrs.is_empty() {
            return Err(Refusal::Refused(self.refusal_of(&refused)));
        }
        let name = match &self.host {
            Host::Name(_) => self.url.host_str().map(str::to_owned),
            Host::Address(_) => None,
        };
        Ok(Destination {
            url: self.url.clone(),
            name,
            addrs,
        })
    }

    fn refusal_of(&self, refused: &[(IpAddr, Special)]) -> String {
        let Some((first, _)) = refused.first() else {
            return format!("callback_url host `{}` resolves to no address", self.host);
        };
        let listed: Vec<String> = refused
            .iter()
            .map(|(ip, class)| format!("{ip} ({})", class.describe()))
            .collect();
        let entry = match first {
            IpAddr::V6(v6) => format!("[{v6}]:{}", self.port),
            IpAddr::V4(v4) => format!("{v4}:{}", self.port),
        };
        format!(
            "callback_url host `{}` resolves to {}, which the webhook allow-list does not name: an entry naming a host opens only its public addresses; a loopback, private, link-local or metadata address needs an entry naming it or a network holding it, such as `{entry}`",
            self.host,
            listed.join(", ")
        )
    }

    /// The addresses the URL's host resolves to now: itself, for an address.
    pub async fn resolve(&self) -> Result<Vec<IpAddr>, Refusal> {
        let name = match &self.host {
            Host::Address(ip) => return Ok(vec![*ip]),
            Host::Name(name) => name.as_str(),
        };
        let unresolved = |why: String| {
            Refusal::Unresolved(format!(
                "callback_url host `{name}` does not resolve: {why}"
            ))
        };
        let found =
            tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((name, self.port)))
                .await
                .map_err(|_| unresolved(format!("no answer within {RESOLVE_TIMEOUT:?}")))?
                .map_err(|e| unresolved(e.to_string()))?;
        Ok(found.map(|addr| addr.ip()).collect())
    }
}

/// Checks `url` against `allow` now: read, admitted, resolved and pinned.
pub async fn check(url: &str, allow: &[AllowRule]) -> Result<Destination, Refusal> {
    let callback = Callback::parse(url)?;
    callback.admitted(allow)?;
    let resolved = callback.resolve().await?;
    callback.pin(allow, &resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(text: &str) -> AllowRule {
        text.parse()
            .unwrap_or_else(|e| panic!("`{text}` refused: {e}"))
    }

    fn rules(texts: &[&str]) -> Vec<AllowRule> {
        texts.iter().map(|t| rule(t)).collect()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("an address")
    }

    #[test]
    fn entries_read_as_a_host_and_its_ports() {
        for (text, canonical) in [
            ("hooks.example.com", "hooks.example.com"),
            ("Hooks.Example.COM.", "hooks.example.com"),
            (" hooks.example.com:8443 ", "hooks.example.com:8443"),
            ("hooks.example.com:*", "hooks.example.com:*"),
            ("localhost:*", "localhost:*"),
            ("127.0.0.1", "127.0.0.1"),
            ("127.0.0.1:*", "127.0.0.1:*"),
            ("10.0.0.0/8", "10.0.0.0/8"),
            ("10.0.0.0/8:*", "10.0.0.0/8:*"),
            ("10.1.2.3/32:9000", "10.1.2.3:9000"),
            ("::1", "::1"),
            ("[::1]", "::1"),
            ("[::1]:8443", "[::1]:8443"),
            ("fd00::/8", "fd00::/8"),
            ("[fd00::/8]:*", "[fd00::/8]:*"),
            ("[::ffff:127.0.0.1]:*", "127.0.0.1:*"),
            ("[::ffff:10.0.0.0/104]:*", "10.0.0.0/8:*"),
            ("0.0.0.0/0:*", "0.0.0.0/0:*"),
            ("fd00::1:8443", "fd00::1:8443"),
            ("under_score.internal", "under_score.internal"),
        ] {
            assert_eq!(rule(text).to_string(), canonical, "{text}");
        }
        assert_eq!(rule("h").ports, Ports::Web);
        assert_eq!(rule("h:443").ports, Ports::One(443));
        assert_eq!(rule("h:*").ports, Ports::Any);
    }

    #[test]
    fn bad_entries_are_refused_with_what_to_write() {
        for (text, says) in [
            ("", "empty"),
            ("   ", "empty"),
            ("bücher.example", "xn--"),
            ("https://hooks.example.com/x", "is a URL"),
            ("user@hooks.example.com", "is a URL"),
            ("hooks.example.com:0", "not a port"),
            ("hooks.example.com:65536", "not a port"),
            ("hooks.example.com:+80", "not a port"),
            ("hooks.example.com:http", "not a port"),
            ("hooks.example.com:", "not a port"),
            ("*.example.com", "wildcards"),
            ("hooks..example.com", "not a host name"),
            ("hooks example.com", "not a host name"),
            (&format!("{}.com", "a".repeat(64)), "not a host name"),
            ("1.2.3.256", "not an IP address"),
            ("10.0.0.0/33", "prefix length of 0 to 32"),
            ("10.0.0.0/-1", "prefix length"),
            ("fd00::/129", "prefix length of 0 to 128"),
            ("10.1.2.3/8", "write `10.0.0.0/8`"),
            ("fe80::1%eth0", "in brackets"),
            ("[::1", "without its `]`"),
            ("[::1]8443", "after `]`"),
            ("[hooks.example.com]:80", "not an IP address"),
            ("a:b:c", "in brackets"),
        ] {
            let error = text.parse::<AllowRule>().expect_err(text);
            assert!(error.contains(says), "`{text}`: {error}");
        }
    }

    #[test]
    fn networks_hold_their_addresses_only() {
        let net = Network::parse("10.0.0.0/8", "x").expect("a network");
        assert!(net.contains(ip("10.255.1.2")));
        assert!(
            net.contains(ip("::ffff:10.1.2.3")),
            "a mapped address is its IPv4 one"
        );
        assert!(!net.contains(ip("11.0.0.1")));
        assert!(!net.contains(ip("fd00::1")));
        let all = Network::parse("0.0.0.0/0", "x").expect("every IPv4 address");
        assert!(all.contains(ip("203.0.113.9")) && !all.contains(ip("2001:db8::1")));
        let ula = Network::parse("fd00::/8", "x").expect("a network");
        assert!(ula.contains(ip("fd12:3456::1")) && !ula.contains(ip("fe80::1")));
        let one = Network::single(ip("127.0.0.1"));
        assert!(one.contains(ip("127.0.0.1")) && !one.contains(ip("127.0.0.2")));
    }

    #[test]
    fn special_addresses_are_classed_and_public_ones_are_not() {
        use Special::*;
        for (text, class) in [
            ("0.0.0.0", Unspecified),
            ("0.1.2.3", Unspecified),
            ("::", Unspecified),
            ("127.0.0.1", Loopback),
            ("127.255.255.254", Loopback),
            ("::1", Loopback),
            ("10.0.0.1", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("192.168.1.1", Private),
            ("fc00::1", Private),
            ("fd00::1", Private),
            ("fec0::1", Private),
            ("100.64.0.1", SharedNat),
            ("100.127.255.255", SharedNat),
            ("169.254.0.1", LinkLocal),
            ("fe80::1", LinkLocal),
            ("169.254.169.254", Metadata),
            ("fd00:ec2::254", Metadata),
            ("100.100.100.200", Metadata),
            ("168.63.129.16", Metadata),
            ("224.0.0.1", Multicast),
            ("ff02::1", Multicast),
            ("255.255.255.255", Reserved),
            ("240.0.0.1", Reserved),
            ("192.0.2.1", Reserved),
            ("198.18.0.1", Reserved),
            ("2001:db8::1", Reserved),
            ("2001::1", Reserved),
            ("::7f00:1", Reserved),
            // IPv6 carrying an IPv4 address is that address's class.
            ("::ffff:127.0.0.1", Loopback),
            ("::ffff:169.254.169.254", Metadata),
            ("::ffff:10.1.2.3", Private),
            ("64:ff9b::a9fe:a9fe", Metadata),
            ("2002:c0a8:0101::1", Private),
        ] {
            assert_eq!(special(ip(text)), Some(class), "{text}");
        }
        for public in [
            "1.1.1.1",
            "8.8.8.8",
            "172.15.255.255",
            "172.32.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "169.253.1.1",
            "2606:4700::1111",
            "2a00:1450::1",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:0808:0808::1",
        ] {
            assert_eq!(special(ip(public)), None, "{public}");
        }
    }

    fn admitted(url: &str, allow: &[&str]) -> Result<(), String> {
        let callback = Callback::parse(url).map_err(|r| r.message().to_owned())?;
        callback
            .admitted(&rules(allow))
            .map_err(|r| r.message().to_owned())
    }

    #[test]
    fn a_url_is_admitted_on_an_entry_naming_its_host_and_port() {
        let allow = [
            "hooks.example.com",
            "alt.example.com:8443",
            "127.0.0.1:*",
            "10.0.0.0/8:9000",
        ];
        for url in [
            "https://hooks.example.com/x",
            "http://hooks.example.com/x",
            "https://HOOKS.example.com./x",
            "https://hooks.example.com:443/x",
            "https://alt.example.com:8443/x",
            "http://127.0.0.1:1/x",
            "http://127.0.0.1:65535/x",
            "http://[::ffff:127.0.0.1]:9/x",
            "http://2130706433:9/x",
            "http://10.9.8.7:9000/x",
        ] {
            assert_eq!(admitted(url, &allow), Ok(()), "{url}");
        }
        for (url, says) in [
            (
                "https://hooks.example.com:8443/x",
                "for ports 80 and 443 only",
            ),
            (
                "http://hooks.example.com:22/x",
                "`hooks.example.com:22` or `hooks.example.com:*`",
            ),
            ("https://alt.example.com/x", "for port 8443 only"),
            ("http://10.9.8.7/x", "for port 9000 only"),
            ("http://evil.example/x", "not in the webhook allow-list"),
            ("http://hooks.example.com.evil.example/x", "allow-list"),
            ("http://127.0.0.2:9/x", "allow-list"),
            ("http://localhost:9/x", "allow-list"),
            ("http://hooks.example.com@evil.example/x", "`evil.example`"),
            ("ftp://hooks.example.com/x", "http or https"),
            ("not a url", "is not a URL"),
            ("http://bücher.example/x", "ASCII"),
            ("file:///etc/passwd", "http or https"),
        ] {
            let error = admitted(url, &allow).expect_err(url);
            assert!(error.contains(says), "{url}: {error}");
        }
    }

    fn pin(url: &str, allow: &[&str], resolved: &[&str]) -> Result<Vec<SocketAddr>, String> {
        let callback = Callback::parse(url).map_err(|r| r.message().to_owned())?;
        let allow = rules(allow);
        callback
            .admitted(&allow)
            .map_err(|r| r.message().to_owned())?;
        let resolved: Vec<IpAddr> = resolved.iter().map(|a| ip(a)).collect();
        callback
            .pin(&allow, &resolved)
            .map(|d| d.addrs)
            .map_err(|r| r.message().to_owned())
    }

    fn addrs(texts: &[&str]) -> Vec<SocketAddr> {
        texts
            .iter()
            .map(|t| t.parse().expect("a socket address"))
            .collect()
    }

    #[test]
    fn a_name_reaches_its_public_addresses_and_a_special_one_only_where_named() {
        let named = ["hooks.example.com:*"];
        let url = "http://hooks.example.com:9000/x";
        assert_eq!(
            pin(
                url,
                &named,
                &["203.0.113.1", "93.184.216.34", "2606:4700::1"]
            ),
            Ok(addrs(&["93.184.216.34:9000", "[2606:4700::1]:9000"])),
            "documentation addresses are special too"
        );
        // Rebinding: the allowed name now resolves to the metadata service,
        // a private or a loopback address.
        for (special, shown) in [
            ("169.254.169.254", "169.254.169.254"),
            ("10.0.0.5", "10.0.0.5"),
            ("127.0.0.1", "127.0.0.1"),
            ("::1", "::1"),
            ("fd00::1", "fd00::1"),
            ("::ffff:192.168.0.1", "192.168.0.1"),
            ("0.0.0.0", "0.0.0.0"),
        ] {
            let error = pin(url, &named, &[special]).expect_err(special);
            assert!(
                error.contains("does not name") && error.contains(shown),
                "{special}: {error}"
            );
        }
        let error = pin(url, &named, &["169.254.169.254"]).expect_err("metadata");
        assert!(
            error.contains("(cloud metadata)") && error.contains("`169.254.169.254:9000`"),
            "{error}"
        );
        // Mixed answers: only the public addresses are kept.
        assert_eq!(
            pin(url, &named, &["127.0.0.1", "93.184.216.34", "10.0.0.1"]),
            Ok(addrs(&["93.184.216.34:9000"]))
        );
        // The address, or a network holding it, for the URL's port opens it.
        let localhost = "http://localhost:4000/hook";
        let by_name = ["localhost:*"];
        let error = pin(localhost, &by_name, &["::1", "127.0.0.1"]).expect_err("loopback by name");
        assert!(
            error.contains("::1 (loopback), 127.0.0.1 (loopback)"),
            "{error}"
        );
        assert!(error.contains("`[::1]:4000`"), "{error}");
        for opening in [
            "127.0.0.1:*",
            "127.0.0.1:4000",
            "127.0.0.0/8:*",
            "[::ffff:127.0.0.1]:4000",
        ] {
            assert_eq!(
                pin(localhost, &["localhost:*", opening], &["::1", "127.0.0.1"]),
                Ok(addrs(&["127.0.0.1:4000"])),
                "{opening}"
            );
        }
        for closed in ["127.0.0.1", "127.0.0.1:4001", "10.0.0.0/8:*", "127.0.0.2:*"] {
            assert!(
                pin(localhost, &["localhost:*", closed], &["::1", "127.0.0.1"]).is_err(),
                "{closed}"
            );
        }
        assert_eq!(
            pin(
                localhost,
                &["localhost:*", "[::1]:*", "127.0.0.1:*"],
                &["::1", "127.0.0.1", "::1"]
            ),
            Ok(addrs(&["[::1]:4000", "127.0.0.1:4000"])),
            "every checked address, once, in the resolver's order"
        );
        // An address in the URL is its own resolution.
        assert_eq!(
            pin("http://127.0.0.1:5/", &["127.0.0.0/8:*"], &["127.0.0.1"]),
            Ok(addrs(&["127.0.0.1:5"]))
        );
        assert!(pin(url, &named, &[]).is_err_and(|e| e.contains("resolves to no address")));
    }

    #[test]
    fn a_destination_pins_a_name_and_leaves_an_address_alone() {
        let allow = rules(&["Hooks.Example.com.:*", "203.0.113.0/24:*"]);
        let callback = Callback::parse("http://hooks.example.com.:81/x").expect("a URL");
        callback.admitted(&allow).expect("admitted");
        let pinned = callback
            .pin(&allow, &[ip("93.184.216.34")])
            .expect("pinned");
        assert_eq!(pinned.name.as_deref(), Some("hooks.example.com."));
        let literal = Callback::parse("http://203.0.113.5:81/x").expect("a URL");
        literal.admitted(&allow).expect("admitted");
        let pinned = literal.pin(&allow, &[ip("203.0.113.5")]).expect("pinned");
        assert_eq!(
            (pinned.name, pinned.addrs),
            (None, addrs(&["203.0.113.5:81"]))
        );
    }

    #[tokio::test]
    async fn a_check_resolves_names_and_refuses_what_no_entry_opens() {
        let url = "http://localhost:4000/hook";
        let refused = check(url, &rules(&["localhost:*"]))
            .await
            .expect_err("loopback by name");
        assert!(
            matches!(&refused, Refusal::Refused(m) if m.contains("loopback")),
            "{refused:?}"
        );
        let pinned = check(url, &rules(&["localhost:*", "127.0.0.0/8:*"]))
            .await
            .expect("opened");
        assert!(
            pinned
                .addrs
                .contains(&"127.0.0.1:4000".parse().expect("an address")),
            "{pinned:?}"
        );
        let metadata = check(
            "http://169.254.169.254/latest/meta-data/",
            &rules(&["127.0.0.1:*"]),
        )
        .await;
        assert!(metadata.is_err());
        let unresolved = check(
            "http://no-such-host.invalid/x",
            &rules(&["no-such-host.invalid"]),
        )
        .await;
        assert!(
            matches!(unresolved, Err(Refusal::Unresolved(_))),
            "{unresolved:?}"
        );
    }
}
