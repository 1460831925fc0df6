//! How core's replies and issues look as JSON (SPEC §6 field names): the
//! serializers the `Serialize` derives of [`crate::rate::RateReply`],
//! [`crate::copy::ReserveReply`], [`crate::copy::CopyStatus`],
//! [`crate::copy::Staged`], [`crate::config::ConfigIssue`] and
//! [`crate::config::Adjustment`] share, so `charon simulate`, the simulator
//! API and logs never show the same reply in two shapes.

use serde::ser::{SerializeSeq, SerializeStruct};
use serde::{Serialize, Serializer};

use crate::UNBOUNDED;

/// A limit for display: `null` when absent or unbounded.
// `serialize_with` hands a reference to the field.
#[allow(clippy::ref_option, clippy::trivially_copy_pass_by_ref)]
pub(crate) fn limit<S: Serializer>(l: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match *l {
        Some(v) if v != UNBOUNDED => s.serialize_u64(v),
        _ => s.serialize_none(),
    }
}

/// A limit that is always configured: `null` when unbounded.
#[allow(clippy::trivially_copy_pass_by_ref)]
pub(crate) fn bound<S: Serializer>(l: &u64, s: S) -> Result<S::Ok, S::Error> {
    limit(&Some(*l), s)
}

/// For `skip_serializing_if`: flags shown only when set (`ignored`).
#[allow(clippy::trivially_copy_pass_by_ref)]
pub(crate) fn is_false(b: &bool) -> bool {
    !*b
}

/// `(name, holds)` pairs as `[{"name": …, "holds": …}]`.
pub(crate) fn named_holds<S: Serializer>(
    groups: &[(String, u64)],
    s: S,
) -> Result<S::Ok, S::Error> {
    struct Named<'a>(&'a str, u64);
    impl Serialize for Named<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut st = s.serialize_struct("GroupHolds", 2)?;
            st.serialize_field("name", self.0)?;
            st.serialize_field("holds", &self.1)?;
            st.end()
        }
    }
    let mut seq = s.serialize_seq(Some(groups.len()))?;
    for (name, holds) in groups {
        seq.serialize_element(&Named(name, *holds))?;
    }
    seq.end()
}

#[cfg(test)]
mod tests {
    use crate::UNBOUNDED;
    use crate::config::{Adjustment, ConfigIssue};
    use crate::copy::{CopyStatus, GroupHolds, Hold, ReserveReply, Staged};
    use crate::rate::{RateReply, TierContext};

    fn json(v: &impl serde::Serialize) -> String {
        serde_json::to_string(v).expect("encodes")
    }

    #[test]
    fn a_rate_reply_in_spec_order_with_unbounded_limits_as_null() {
        let mut r = RateReply {
            granted: 2,
            hard_limit: None,
            global_limit: Some(UNBOUNDED),
            tier_limit: UNBOUNDED,
            domain_hits_last_second: 3,
            global_hits_last_second: 4,
            tier_hits: 5,
            tier: 1,
            burst: true,
            hard_limited: false,
            global_limited: false,
            ignored: false,
            context: TierContext::default(),
        };
        let context = r#","limit":0,"remaining":0,"reset_after_ms":null,"retry_after_ms":null,"warning":false,"banned":false}"#;
        let plain = r#"{"granted":2,"hard_limit":null,"global_limit":null,"tier_limit":null,"domain_hits_last_second":3,"global_hits_last_second":4,"tier_hits":5,"tier":1,"burst":true,"hard_limited":false,"global_limited":false"#;
        assert_eq!(json(&r), format!("{plain}{context}"));
        r.ignored = true;
        assert_eq!(json(&r), format!("{plain},\"ignored\":true{context}"));
        r.hard_limit = Some(7);
        assert!(json(&r).contains(r#""hard_limit":7,"#));
    }

    #[test]
    fn copy_replies_in_spec_order() {
        let r = ReserveReply {
            granted: 1,
            domain_limit: UNBOUNDED,
            global_limit: Some(9),
            domain_holds: 1,
            global_holds: 2,
            groups: vec![GroupHolds {
                name: "g".into(),
                limit: 3,
                holds: 1,
            }],
            ignored: false,
            queue_full: false,
            result_ready: false,
            waited_ms: None,
        };
        assert_eq!(
            json(&r),
            r#"{"granted":1,"domain_limit":null,"global_limit":9,"domain_holds":1,"global_holds":2,"groups":[{"name":"g","limit":3,"holds":1}]}"#
        );
        let s = CopyStatus {
            domain_holds: 1,
            global_holds: 2,
            groups: vec![("a".into(), 1), ("b".into(), 0)],
        };
        assert_eq!(
            json(&s),
            r#"{"domain_holds":1,"global_holds":2,"groups":[{"name":"a","holds":1},{"name":"b","holds":0}]}"#
        );
        let staged = Staged {
            hold: Hold::new("r", "d", ["b".to_owned(), "a".to_owned()]),
            copies: 2,
        };
        assert_eq!(
            json(&staged),
            r#"{"resource":"r","domain":"d","groups":["a","b"],"copies":2}"#
        );
    }

    #[test]
    fn issues_and_adjustments_as_path_and_text() {
        let i = ConfigIssue {
            path: "tiers[0].limit".into(),
            message: "is required".into(),
        };
        assert_eq!(
            json(&i),
            r#"{"path":"tiers[0].limit","message":"is required"}"#
        );
        let a = Adjustment {
            path: "tiers[1]".into(),
            change: "removed".into(),
        };
        assert_eq!(json(&a), r#"{"path":"tiers[1]","change":"removed"}"#);
    }
}
