//! Key names. Every key of one operation shares a hash tag, so it lives in
//! one Redis Cluster slot:
//!
//! ```text
//! <prefix>:{<resource>}:r:<domain>     rate state of a (resource, domain) pair
//! <prefix>:{<resource>}:rs:<domain>    its hits in the last second (list)
//! <prefix>:{<resource>}:rt<i>:<domain> its hits in tier i (list)
//! <prefix>:{<resource>}:m:<domain>     bucket, window or queue state of a pair (string)
//! <prefix>:{<resource>}:g              the resource's last second of hits (list, G)
//! <prefix>:{<resource>}:gn             the total of that list
//! <prefix>:{<resource>}:c              copy counts
//! <prefix>:{<resource>}:s:<member>     one member's contribution to the counts
//! <prefix>:{<resource>}:x              staged transfers
//! <prefix>:{<resource>}:xe             staged transfers by expiry
//! <prefix>:{<resource>}:o:<member>:<n> what a member's copy operation did
//! <prefix>:{<resource>}:q, :qw, :qd, :qr, :qn
//!                                     its queue of waiters (see `wait.lua`)
//! <prefix>:{<resource>}:l              the resource's capacity leases
//! <prefix>:{%e<domain>}:m:<n>:<resource>:<domain>
//!                                     a pair's meter state counted for the
//!                                     Envoy domain <domain> with `same_slot`
//!                                     (<n>: the resource's length in bytes)
//! <prefix>:{%e<domain>}:t:<n>:<resource>:r:<domain> (and :rs:, :rt<i>:,
//!                                     :g, :gn as above) a pair's burst
//!                                     tiers counted there
//! <prefix>:{%m}:servers                registered members
//! <prefix>:{%m}:live:<member>          a member's liveness (PX ttl)
//! <prefix>:{%m}:keys:<member>          resources a member contributed to
//! <prefix>:{%m}:gen                    the generation of the copy log
//! <prefix>:{%m}:starting               held while a lone starter cleans up
//! <prefix>:{%m}:staging                resources with staged transfers
//! <prefix>:{%m}:dead                   fenced members not cleaned up yet
//! <prefix>:{%m}:suspect:<member>       since when a member seems lapsed
//! <prefix>:{%m}:rebuild                the copy gate of a new generation
//! <prefix>:{%m}:tick                   when a membership script last ran
//! <prefix>:{%m}:leases                 resources that have lease sets
//! <prefix>:{%m}:queues                 resources that have had waiters
//! <prefix>:wake:<member>               a member's wake-up channel (pub/sub)
//! ```
//!
//! The resource inside the braces is escaped (`%` → `%25`, `{` → `%7B`,
//! `}` → `%7D`), so that the first `}` always closes the tag and two
//! resources never share keys; `%m` can therefore never be a resource's
//! tag. Likewise `%e…`, the tag of an Envoy domain with `same_slot`, is
//! never a resource's, and its envoy domain is escaped the same way.

use std::borrow::Cow;

/// The tag of the membership keys; escaping makes it impossible for a
/// resource (every `%` of a resource becomes `%25`).
const MEMBERS_TAG: &str = "%m";

/// Builds key names under one prefix.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    /// Keys under `prefix`, which must have passed [`check_prefix`].
    pub(crate) fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    /// `<prefix>:{<escaped tag>}`: the start of every key of `resource`.
    fn resource(&self, resource: &str) -> String {
        self.tagged(&escape(resource))
    }

    fn tagged(&self, tag: &str) -> String {
        format!("{}:{{{}}}", self.prefix, tag)
    }

    /// The keys of a (resource, domain) pair's rate state and of the
    /// resource's last second.
    pub(crate) fn rate(&self, resource: &str, domain: &str) -> RateKeys {
        let base = self.resource(resource);
        RateKeys {
            state: format!("{base}:r:{domain}"),
            last_second: format!("{base}:rs:{domain}"),
            global: format!("{base}:g"),
            global_total: format!("{base}:gn"),
            tier_head: format!("{base}:rt"),
            tier_tail: format!(":{domain}"),
        }
    }

    /// The key of a (resource, domain) pair's bucket, window or queue
    /// state (see `drain.lua` or `window.lua`).
    pub(crate) fn meter(&self, resource: &str, domain: &str) -> String {
        format!("{}:m:{domain}", self.resource(resource))
    }

    /// The key of a pair's meter state counted for the Envoy domain
    /// `envoy_domain` with `same_slot`: every key of that domain carries
    /// the domain's tag, so one batch is one Redis Cluster slot. The
    /// resource's length comes first so that no resource and Charon domain
    /// can spell another pair's key.
    pub(crate) fn meter_in_slot(&self, envoy_domain: &str, resource: &str, domain: &str) -> String {
        let tag = format!("%e{}", escape(envoy_domain));
        format!(
            "{}:m:{}:{resource}:{domain}",
            self.tagged(&tag),
            resource.len()
        )
    }

    /// The keys of a (resource, domain) pair's burst tiers counted for the
    /// Envoy domain `envoy_domain` with `same_slot`, and of the resource's
    /// last second counted there: under the domain's tag like
    /// [`Keys::meter_in_slot`], apart from the resource's own counts, with
    /// the resource's length first so that no resource and Charon domain
    /// can spell another pair's keys.
    pub(crate) fn rate_in_slot(
        &self,
        envoy_domain: &str,
        resource: &str,
        domain: &str,
    ) -> RateKeys {
        let tag = format!("%e{}", escape(envoy_domain));
        let base = format!("{}:t:{}:{resource}", self.tagged(&tag), resource.len());
        RateKeys {
            state: format!("{base}:r:{domain}"),
            last_second: format!("{base}:rs:{domain}"),
            global: format!("{base}:g"),
            global_total: format!("{base}:gn"),
            tier_head: format!("{base}:rt"),
            tier_tail: format!(":{domain}"),
        }
    }

    /// The copy keys of `resource` for `member`: counts, its contribution,
    /// staging and staging expiry.
    pub(crate) fn copies(&self, resource: &str, member: &str) -> CopyKeys {
        CopyKeys::under(self.resource(resource), member)
    }

    /// The record of one copy operation of `member` (see `copy.lua`).
    pub(crate) fn op_record(&self, resource: &str, member: &str, seq: u64) -> String {
        format!("{}:o:{member}:{seq}", self.resource(resource))
    }

    /// The copy keys of an already escaped tag (found by a scan).
    pub(crate) fn copies_of_tag(&self, tag: &str, member: &str) -> CopyKeys {
        CopyKeys::under(self.tagged(tag), member)
    }

    fn members(&self, what: &str) -> String {
        format!("{}:{what}", self.tagged(MEMBERS_TAG))
    }

    pub(crate) fn registry(&self) -> String {
        self.members("servers")
    }

    pub(crate) fn live(&self, member: &str) -> String {
        format!("{}{member}", self.live_prefix())
    }

    /// What every liveness key starts with (scripts append the member).
    pub(crate) fn live_prefix(&self) -> String {
        self.members("live:")
    }

    pub(crate) fn dead(&self) -> String {
        self.members("dead")
    }

    pub(crate) fn suspect(&self, member: &str) -> String {
        self.members(&format!("suspect:{member}"))
    }

    pub(crate) fn rebuild(&self) -> String {
        self.members("rebuild")
    }

    pub(crate) fn tick(&self) -> String {
        self.members("tick")
    }

    pub(crate) fn key_set(&self, member: &str) -> String {
        self.members(&format!("keys:{member}"))
    }

    pub(crate) fn generation(&self) -> String {
        self.members("gen")
    }

    pub(crate) fn start_lock(&self) -> String {
        self.members("starting")
    }

    /// The leases of a lease resource (SPEC §12), one hash (see
    /// `lease.rs`).
    pub(crate) fn lease_set(&self, resource: &str) -> String {
        format!("{}:l", self.resource(resource))
    }

    /// The resources that have lease sets, for metrics and the leases page.
    pub(crate) fn lease_index(&self) -> String {
        self.members("leases")
    }

    /// The resources (escaped tags) that have had waiters, scored by the
    /// last join, for [`crate::Store::queue_lengths`].
    pub(crate) fn queue_index(&self) -> String {
        self.members("queues")
    }

    /// The queue of waiters of an already escaped tag (a sorted set).
    pub(crate) fn queue_of_tag(&self, tag: &str) -> String {
        format!("{}:q", self.tagged(tag))
    }

    /// The pub/sub channel on which the scripts wake `member`'s waiters
    /// (`wait.lua` names it the same way).
    pub(crate) fn wake_channel(&self, member: &str) -> String {
        format!("{}:wake:{member}", self.prefix)
    }

    pub(crate) fn staging_index(&self) -> String {
        self.members("staging")
    }

    /// A `SCAN MATCH` pattern for copy keys of every resource (and, as the
    /// pattern cannot be exact, some others that [`Keys::parse`] sorts out).
    pub(crate) fn copy_scan_pattern(&self) -> String {
        format!("{}:{{*}}:[csx]*", self.prefix)
    }

    /// A `SCAN MATCH` pattern for `member`'s contributions (member ids
    /// contain no pattern characters: see [`check_server_id`]).
    pub(crate) fn contribution_scan_pattern(&self, member: &str) -> String {
        format!("{}:{{*}}:s:{member}", self.prefix)
    }

    /// A `SCAN MATCH` pattern for every member's key set.
    /// The `SCAN` pattern of every key under the prefix (its characters
    /// are never glob patterns: see [`check_prefix`]).
    pub(crate) fn all_scan_pattern(&self) -> String {
        format!("{}:*", self.prefix)
    }

    pub(crate) fn key_set_scan_pattern(&self) -> String {
        format!("{}:*", self.members("keys"))
    }

    /// The member whose key set `key` is.
    pub(crate) fn key_set_member<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(&self.members("keys:"))
    }

    /// Sorts a key found by a scan: `(escaped tag, kind)` for a resource's
    /// copy key.
    pub(crate) fn parse<'k>(&self, key: &'k str) -> Option<(&'k str, CopyKind<'k>)> {
        let rest = key.strip_prefix(&self.prefix)?.strip_prefix(":{")?;
        let (tag, rest) = rest.split_once('}')?;
        if tag == MEMBERS_TAG {
            return None;
        }
        let kind = match rest.strip_prefix(':')? {
            "c" => CopyKind::Counts,
            "x" => CopyKind::Staging,
            "xe" => CopyKind::StagingExpiry,
            other => CopyKind::Contribution(other.strip_prefix("s:")?),
        };
        Some((tag, kind))
    }
}

/// The keys the rate script touches.
#[derive(Debug, Clone)]
pub(crate) struct RateKeys {
    pub(crate) state: String,
    pub(crate) last_second: String,
    pub(crate) global: String,
    pub(crate) global_total: String,
    /// A tier's list is `tier_head`, its index, `tier_tail`.
    pub(crate) tier_head: String,
    pub(crate) tier_tail: String,
}

impl RateKeys {
    pub(crate) fn tier(&self, i: usize) -> String {
        format!("{}{i}{}", self.tier_head, self.tier_tail)
    }
}

/// What a copy key found by a scan holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyKind<'k> {
    Counts,
    Contribution(&'k str),
    Staging,
    StagingExpiry,
}

/// The keys a copy script touches, in the order the scripts take them.
#[derive(Debug, Clone)]
pub(crate) struct CopyKeys {
    pub(crate) counts: String,
    pub(crate) contribution: String,
    pub(crate) staging: String,
    pub(crate) staging_expiry: String,
}

impl CopyKeys {
    fn under(base: String, member: &str) -> Self {
        Self {
            counts: format!("{base}:c"),
            contribution: format!("{base}:s:{member}"),
            staging: format!("{base}:x"),
            staging_expiry: format!("{base}:xe"),
        }
    }

    /// KEYS of reserve, release, transfer and seize.
    pub(crate) fn all(&self) -> [&str; 4] {
        [
            &self.counts,
            &self.contribution,
            &self.staging,
            &self.staging_expiry,
        ]
    }
}

/// Escapes a resource name for use as a hash tag.
pub(crate) fn escape(resource: &str) -> Cow<'_, str> {
    if !resource.contains(['%', '{', '}']) {
        return Cow::Borrowed(resource);
    }
    let mut out = String::with_capacity(resource.len() + 8);
    for c in resource.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// A resource's name from its escaped tag: the inverse of [`escape`].
pub(crate) fn unescape(tag: &str) -> String {
    let mut out = String::with_capacity(tag.len());
    let mut rest = tag;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let code = rest.get(i..i + 3);
        let c = match code {
            Some("%25") => '%',
            Some("%7B") => '{',
            Some("%7D") => '}',
            _ => {
                out.push('%');
                rest = &rest[i + 1..];
                continue;
            }
        };
        out.push(c);
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    out
}

/// Checks a key prefix: non-empty, and only characters that mean nothing
/// to hash tags or `SCAN MATCH` patterns.
pub(crate) fn check_prefix(prefix: &str) -> Result<(), String> {
    let ok = !prefix.is_empty()
        && prefix.len() <= 64
        && prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | ':' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "key prefix {prefix:?} must be 1 to 64 characters of A-Z, a-z, 0-9, '-', '_', ':' or '.'"
        ))
    }
}

/// Checks a server id: it becomes part of key names and log lines.
pub(crate) fn check_server_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id.chars().all(|c| {
            c.is_ascii_graphic() && !matches!(c, '{' | '}' | '*' | '?' | '[' | ']' | '\\')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "server id {id:?} must be 1 to 128 printable ASCII characters without braces, brackets, '*', '?' or '\\'"
        ))
    }
}

/// A transfer id: 128 random bits in hex, a dot, then the resource, so
/// that a seize finds the resource's slot without a lookup.
pub(crate) fn transfer_id(resource: &str) -> String {
    format!("{:032x}.{resource}", rand::random::<u128>())
}

/// The resource a transfer id names, if the id is well-formed.
pub(crate) fn transfer_resource(id: &str) -> Option<&str> {
    let (random, resource) = id.split_once('.')?;
    let well_formed =
        random.len() == 32 && random.bytes().all(|b| b.is_ascii_hexdigit()) && !resource.is_empty();
    well_formed.then_some(resource)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_never_share_keys_or_break_tags() {
        let k = Keys::new("charon");
        let r = k.rate("api/search", "t-1");
        assert_eq!(r.state, "charon:{api/search}:r:t-1");
        assert_eq!(r.last_second, "charon:{api/search}:rs:t-1");
        assert_eq!(r.tier(2), "charon:{api/search}:rt2:t-1");
        assert_eq!(r.global_total, "charon:{api/search}:gn");
        assert_eq!(k.rate("a}b", "d").global, "charon:{a%7Db}:g");
        assert_eq!(k.rate("%m", "d").global, "charon:{%25m}:g");
        assert_ne!(k.rate("%7D", "d").global, k.rate("}", "d").global);
        assert_eq!(k.registry(), "charon:{%m}:servers");
        assert_eq!(k.live("s1.ab"), "charon:{%m}:live:s1.ab");
        assert_eq!(k.suspect("s1.ab"), "charon:{%m}:suspect:s1.ab");
        let c = k.copies("vm{1}", "s1.ab");
        assert_eq!(c.counts, "charon:{vm%7B1%7D}:c");
        assert_eq!(c.contribution, "charon:{vm%7B1%7D}:s:s1.ab");
    }

    #[test]
    fn same_slot_keys_share_the_envoy_domains_tag() {
        let k = Keys::new("charon");
        let a = k.meter_in_slot("edge", "api/search", "203.0.113.7/32");
        let b = k.meter_in_slot("edge", "envoy/edge/tenant", "acme");
        assert_eq!(a, "charon:{%eedge}:m:10:api/search:203.0.113.7/32");
        assert_eq!(b, "charon:{%eedge}:m:17:envoy/edge/tenant:acme");
        let tag = |key: &str| {
            key.split_once('{')
                .and_then(|(_, r)| r.split_once('}'))
                .map(|(t, _)| t.to_owned())
        };
        assert_eq!(tag(&a), tag(&b));
        // Never a resource's tag, never the resource's own counts.
        assert_ne!(tag(&a), tag(&k.meter("%eedge", "d")));
        assert_ne!(k.meter_in_slot("edge", "r", "d"), k.meter("r", "d"));
        // Braces in the domain cannot close the tag early.
        assert_eq!(k.meter_in_slot("a}b", "r", "d"), "charon:{%ea%7Db}:m:1:r:d");
        // The length keeps (resource, domain) pairs apart.
        assert_ne!(
            k.meter_in_slot("e", "a:b", "c"),
            k.meter_in_slot("e", "a", "b:c")
        );
        // A scan for copy keys never takes them.
        assert_eq!(k.parse(&a), None);
        // Burst tiers: every key of the pair, and the resource's last
        // second, under the same tag, apart from the resource's own.
        let t = k.rate_in_slot("edge", "api/search", "acme");
        assert_eq!(t.state, "charon:{%eedge}:t:10:api/search:r:acme");
        for key in [
            &t.state,
            &t.last_second,
            &t.global,
            &t.global_total,
            &t.tier(3),
        ] {
            assert_eq!(tag(key), tag(&a));
        }
        assert_ne!(t.global, k.rate("api/search", "acme").global);
        assert_ne!(t.state, k.meter_in_slot("edge", "api/search", "acme"));
        assert_eq!(k.parse(&t.global), None);
    }

    #[test]
    fn scanned_keys_are_sorted_out() {
        let k = Keys::new("charon");
        let c = k.copies("a:b}", "m1");
        assert_eq!(k.parse(&c.counts), Some(("a:b%7D", CopyKind::Counts)));
        assert_eq!(
            k.parse(&c.contribution),
            Some(("a:b%7D", CopyKind::Contribution("m1")))
        );
        assert_eq!(k.parse(&c.staging), Some(("a:b%7D", CopyKind::Staging)));
        assert_eq!(
            k.parse(&c.staging_expiry),
            Some(("a:b%7D", CopyKind::StagingExpiry))
        );
        let r = k.rate("r", "x}:c");
        let t1 = r.tier(1);
        for key in [r.state, r.last_second, r.global, r.global_total, t1] {
            assert_eq!(k.parse(&key), None, "{key}");
        }
        assert_eq!(k.parse(&k.op_record("r", "m", 7)), None);
        assert_eq!(k.op_record("r", "m", 7), "charon:{r}:o:m:7");
        assert_eq!(k.parse(&k.registry()), None);
        assert_eq!(k.parse("other:{r}:c"), None);
        assert_eq!(k.key_set_member(&k.key_set("m1")), Some("m1"));
    }

    #[test]
    fn transfer_ids_carry_their_resource() {
        let id = transfer_id("sandbox/vm.large");
        assert_eq!(transfer_resource(&id), Some("sandbox/vm.large"));
        assert_eq!(transfer_resource("t1"), None);
        assert_eq!(transfer_resource("nonsense.r"), None);
        assert_eq!(transfer_resource(&format!("{}.", "0".repeat(32))), None);
    }

    #[test]
    fn prefixes_and_server_ids_are_checked() {
        assert!(check_prefix("charon").is_ok());
        assert!(check_prefix("a{b").is_err());
        assert!(check_prefix("a*").is_err());
        assert!(check_prefix("").is_err());
        assert!(check_server_id("web-1.example").is_ok());
        assert!(check_server_id("a b").is_err());
        assert!(check_server_id("").is_err());
    }
}
