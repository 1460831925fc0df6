//! The ids of Boulder's overrides (seed 002's id formats), checked and
//! written as the Charon domain a client sends: an IP address in its
//! canonical form, an IPv6 /48 as its network (`2001:db8::/48`), a
//! registration id, `regId:domain`, and a set of names normalized (lower
//! case, sorted, de-duplicated) so that the same set is always the same
//! domain.

use std::net::{IpAddr, Ipv6Addr};

/// How a limit's overrides name their subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum IdFormat {
    /// `ipAddress`.
    IpAddress,
    /// `ipv6RangeCIDR`: a /48.
    Ipv6Range,
    /// `regId`.
    RegId,
    /// `regId`, or `regId:identValue` (a name or an address).
    RegIdOrIdent,
    /// `domainOrCIDR`: a name or an address.
    DomainOrCidr,
    /// `fqdnSet`: names and addresses, comma-separated.
    FqdnSet,
    /// `regId:fqdnSet` (seed 002's `CertificatesPerFQDNSetPerAccount`).
    RegIdFqdnSet,
}

/// Every limit name and its id format: Boulder's, and seed 002's
/// `CertificatesPerFQDNSetPerAccount`.
pub(super) const NAMES: &[(&str, IdFormat)] = &[
    ("NewRegistrationsPerIPAddress", IdFormat::IpAddress),
    ("NewRegistrationsPerIPv6Range", IdFormat::Ipv6Range),
    ("NewOrdersPerAccount", IdFormat::RegId),
    (
        "FailedAuthorizationsPerDomainPerAccount",
        IdFormat::RegIdOrIdent,
    ),
    ("CertificatesPerDomain", IdFormat::DomainOrCidr),
    ("CertificatesPerDomainPerAccount", IdFormat::RegIdOrIdent),
    ("CertificatesPerFQDNSet", IdFormat::FqdnSet),
    (
        "FailedAuthorizationsForPausingPerDomainPerAccount",
        IdFormat::RegIdOrIdent,
    ),
    ("LimitOverrideRequestsPerIPAddress", IdFormat::IpAddress),
    ("CertificatesPerFQDNSetPerAccount", IdFormat::RegIdFqdnSet),
];

/// The format of a limit name, if it is one.
pub(super) fn format_of(name: &str) -> Option<IdFormat> {
    NAMES.iter().find(|(n, _)| *n == name).map(|&(_, f)| f)
}

/// Every limit name, for messages.
pub(super) fn names() -> String {
    NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

/// What an id becomes: the Charon domain, and a note when it was
/// normalized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Normalized {
    pub domain: String,
    pub note: Option<String>,
}

fn same(id: &str, domain: String) -> Normalized {
    let note = (domain != id).then(|| format!("the id {id:?} is the domain {domain:?}"));
    Normalized { domain, note }
}

/// Checks `id` for `format`; the domain it is counted under, or why it
/// is refused (Boulder's reasons).
pub(super) fn normalize(format: IdFormat, id: &str) -> Result<Normalized, String> {
    match format {
        IdFormat::IpAddress => {
            let ip: IpAddr = id
                .parse()
                .map_err(|_| format!("invalid IP address, {id:?} must be an IP address"))?;
            Ok(same(id, ip.to_string()))
        }
        IdFormat::Ipv6Range => {
            let (addr, bits) = id
                .split_once('/')
                .ok_or_else(|| format!("invalid CIDR, {id:?} must be an IPv6 CIDR range"))?;
            let a: Ipv6Addr = addr
                .parse()
                .map_err(|_| format!("invalid CIDR, {id:?} must be an IPv6 CIDR range"))?;
            if bits != "48" {
                return Err(format!("invalid CIDR, {id:?} must be /48"));
            }
            let keep = u128::MAX << 80;
            Ok(same(
                id,
                format!("{}/48", Ipv6Addr::from(u128::from(a) & keep)),
            ))
        }
        IdFormat::RegId => reg_id(id).map(|r| same(id, r)),
        IdFormat::RegIdOrIdent => match id.split_once(':') {
            None => reg_id(id).map(|r| same(id, r)),
            Some((r, ident)) => {
                let r = reg_id(r).map_err(|_| {
                    format!("invalid regId, {id:?} must be formatted 'regId:identValue'")
                })?;
                let v = ident_value(ident).map_err(|e| {
                    format!("invalid identValue, {id:?} must be formatted 'regId:identValue': {e}")
                })?;
                Ok(same(id, format!("{r}:{v}")))
            }
        },
        IdFormat::DomainOrCidr => {
            if let Ok(ip) = id.parse::<IpAddr>() {
                // Boulder counts an address by its covering prefix: /32 for
                // IPv4, /64 for IPv6 (the lowest address of it).
                return Ok(match ip {
                    IpAddr::V4(a) => same(id, format!("{a}/32")),
                    IpAddr::V6(a) => {
                        let net = u128::from(a) & (u128::MAX << 64);
                        if net != u128::from(a) {
                            return Err(format!(
                                "invalid IP address {id:?}, must be the lowest address in its \
                                 prefix ({:?})",
                                Ipv6Addr::from(net).to_string()
                            ));
                        }
                        same(id, format!("{a}/64"))
                    }
                });
            }
            domain(id).map(|d| same(id, d))
        }
        IdFormat::FqdnSet => fqdn_set(id).map(|s| same(id, s)),
        IdFormat::RegIdFqdnSet => {
            let (r, set) = id.split_once(':').ok_or_else(|| {
                format!("invalid regId:fqdnSet, {id:?} must be formatted 'regId:fqdnSet'")
            })?;
            let r = reg_id(r)?;
            Ok(same(id, format!("{r}:{}", fqdn_set(set)?)))
        }
    }
}

fn reg_id(id: &str) -> Result<String, String> {
    id.parse::<u64>()
        .map(|n| n.to_string())
        .map_err(|_| format!("invalid regId, {id:?} must be an ACME registration Id"))
}

/// A name or an address, as an identifier value.
fn ident_value(v: &str) -> Result<String, String> {
    if let Ok(ip) = v.parse::<IpAddr>() {
        return Ok(ip.to_string());
    }
    domain(v)
}

/// A DNS name as Boulder accepts one in an override (lower-cased): labels
/// of letters, digits and `-` (not first or last), 1 to 63 bytes each, at
/// least two of them, at most 253 bytes in all.
fn domain(d: &str) -> Result<String, String> {
    let lower = d.to_ascii_lowercase();
    let why = if lower.is_empty() {
        Some("Domain name is empty")
    } else if lower.len() > 253 {
        Some("Domain name is longer than 253 bytes")
    } else if !lower.contains('.') {
        Some("Domain name needs at least one dot")
    } else if lower.split('.').any(|l| {
        l.is_empty()
            || l.len() > 63
            || l.starts_with('-')
            || l.ends_with('-')
            || !l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    }) {
        Some("Domain name contains an invalid label")
    } else {
        None
    };
    match why {
        Some(w) => Err(format!("{d:?} is neither a domain ({w}) nor an IP address")),
        None => Ok(lower),
    }
}

/// `a.com,B.org,a.com` → `a.com,b.org`.
fn fqdn_set(set: &str) -> Result<String, String> {
    let mut values = Vec::new();
    for v in set.split(',') {
        values.push(
            ident_value(v.trim()).map_err(|e| format!("invalid fqdnSet member {set:?}: {e}"))?,
        );
    }
    values.sort();
    values.dedup();
    Ok(values.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_become_the_domains_clients_send() {
        let n = |f, id| normalize(f, id).map(|n| n.domain);
        assert_eq!(n(IdFormat::IpAddress, "10.0.0.2"), Ok("10.0.0.2".into()));
        assert_eq!(
            n(
                IdFormat::IpAddress,
                "2001:0db8:0000:0000:0000:ff00:0042:8329"
            ),
            Ok("2001:db8::ff00:42:8329".into())
        );
        assert_eq!(
            n(IdFormat::Ipv6Range, "2001:0db8:0000::/48"),
            Ok("2001:db8::/48".into())
        );
        assert!(n(IdFormat::Ipv6Range, "2001:db8::/56").is_err());
        assert!(n(IdFormat::Ipv6Range, "10.0.0.0/48").is_err());
        assert_eq!(n(IdFormat::RegId, "12345678"), Ok("12345678".into()));
        assert!(n(IdFormat::RegId, "lol").is_err());
        assert_eq!(
            n(IdFormat::RegIdOrIdent, "12345678:Example.COM"),
            Ok("12345678:example.com".into())
        );
        assert_eq!(
            n(
                IdFormat::RegIdFqdnSet,
                "12345678:example.org,Example.com,example.org"
            ),
            Ok("12345678:example.com,example.org".into())
        );
        assert_eq!(
            n(IdFormat::DomainOrCidr, "64.112.117.1"),
            Ok("64.112.117.1/32".into())
        );
        assert_eq!(
            n(IdFormat::DomainOrCidr, "2602:80a:6000:666::"),
            Ok("2602:80a:6000:666::/64".into())
        );
        assert!(n(IdFormat::DomainOrCidr, "VelociousVacherin").is_err());
        assert_eq!(
            n(IdFormat::FqdnSet, "2602:80a:6000::1,9.9.9.9,example.com"),
            Ok("2602:80a:6000::1,9.9.9.9,example.com".into())
        );
    }
}
