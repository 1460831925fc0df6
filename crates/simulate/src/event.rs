//! One event of a simulation's input read from its JSON line: the
//! operation it asks for, each field checked with its path.

use charon_core::ClientError;
use charon_core::config::ConfigErrors;
use charon_core::copy::Hold;
use charon_core::fields::{self, Issues, Path, describe};
use charon_core::request::Amount;
use charon_limiter::CapacityAsk;
use serde_json::{Map, Value};

use super::DEFAULT_SESSION;

pub(crate) enum Op {
    /// The last field is `dry_run`.
    Request(String, String, Amount, bool),
    Charge(String, String, u64),
    Refund(String, String, u64),
    /// The last field is `wait_ms`.
    Reserve(String, String, Amount, u64),
    /// The last field is `result_ready`.
    Release(Hold, u64, bool),
    Transfer(Hold, u64, u64),
    Seize(String),
    /// `get_capacity` for one resource: the client and what it asks.
    GetCapacity(String, CapacityAsk),
    /// `release_capacity`: the client and the resource.
    ReleaseCapacity(String, String),
    End,
}

/// An event whose fields are all well-formed; the amounts of `request` and
/// `reserve` are not yet checked against each other.
pub(crate) enum Parsed {
    /// The last field is `dry_run`.
    Request(String, String, u64, u64, bool),
    /// The last field is `wait_ms`.
    Reserve(String, String, u64, u64, u64),
    Op(Op),
}

const OPS: &[&str] = &[
    "request",
    "charge",
    "refund",
    "reserve",
    "release",
    "transfer",
    "seize",
    "end_session",
    "get_capacity",
    "release_capacity",
];

/// The fields each op may have, `t` and `op` included.
fn fields_of(op: &str) -> &'static [&'static str] {
    match op {
        "request" => &[
            "t",
            "op",
            "resource",
            "domain",
            "copies",
            "min_copies",
            "dry_run",
            "session",
        ],
        "charge" | "refund" => &["t", "op", "resource", "domain", "copies"],
        "reserve" => &[
            "t",
            "op",
            "resource",
            "domain",
            "copies",
            "min_copies",
            "session",
            "wait_ms",
        ],
        "release" => &[
            "t",
            "op",
            "resource",
            "domain",
            "copies",
            "groups",
            "session",
            "result_ready",
        ],
        "transfer" => &[
            "t", "op", "resource", "domain", "copies", "groups", "ttl_ms", "session",
        ],
        "seize" => &["t", "op", "transfer_id", "session"],
        "get_capacity" => &[
            "t",
            "op",
            "client",
            "resource",
            "wants",
            "has",
            "subclients",
        ],
        "release_capacity" => &["t", "op", "client", "resource"],
        _ => &["t", "op", "session"],
    }
}

/// Reads an event with the field checker every input path uses
/// ([`charon_core::fields`]): every problem is reported, with the field's
/// path.
pub(crate) fn read_event(v: &Value) -> Result<(u64, String, Parsed), ConfigErrors> {
    let root = Path::root();
    let mut issues = Issues::default();
    let Value::Object(m) = v else {
        issues.push(
            &root,
            format!("expected an event (a mapping), found {}", describe(v)),
        );
        return Err(ConfigErrors(issues.into_vec()));
    };
    let op = fields::required(m, "op", &root, &mut issues)
        .and_then(|op| fields::one_of(op, OPS, &root.key("op"), &mut issues));
    if let Some(op) = op {
        let mut known = fields_of(op).to_vec();
        known.push("id");
        fields::unknown_fields(m, &root, &known, &mut issues);
    }
    let t = fields::required(m, "t", &root, &mut issues)
        .and_then(|t| fields::count(t, &root.key("t"), &mut issues));
    let session = match m.get("session") {
        None => Some(DEFAULT_SESSION.to_owned()),
        Some(s) => fields::string(s, &root.key("session"), &mut issues),
    };
    let mut ev = Event { m, issues };
    let parsed = match op {
        Some(op @ ("request" | "reserve")) => {
            let resource = ev.string("resource");
            let domain = ev.string("domain");
            let copies = ev.count_or_one("copies");
            let min = ev.count_or_one("min_copies");
            let dry_run = Some(op == "request" && ev.flag("dry_run"));
            let wait_ms = fields::count_or(ev.m, "wait_ms", 0, &root, &mut ev.issues);
            match (resource, domain, copies, min, dry_run, wait_ms) {
                (Some(r), Some(d), Some(c), Some(m), Some(dry), _) if op == "request" => {
                    Some(Parsed::Request(r, d, c, m, dry))
                }
                (Some(r), Some(d), Some(c), Some(m), Some(_), Some(w)) => {
                    Some(Parsed::Reserve(r, d, c, m, w))
                }
                _ => None,
            }
        }
        Some(op @ ("charge" | "refund")) => {
            let resource = ev.string("resource");
            let domain = ev.string("domain");
            let copies = ev.count_or_one("copies");
            match (resource, domain, copies) {
                (Some(r), Some(d), Some(c)) if op == "charge" => {
                    Some(Parsed::Op(Op::Charge(r, d, c)))
                }
                (Some(r), Some(d), Some(c)) => Some(Parsed::Op(Op::Refund(r, d, c))),
                _ => None,
            }
        }
        Some("release") => {
            let hold = ev.hold();
            let copies = ev.count_or_one("copies");
            let ready = ev.flag("result_ready");
            hold.zip(copies)
                .map(|(h, c)| Parsed::Op(Op::Release(h, c, ready)))
        }
        Some("transfer") => {
            let hold = ev.hold();
            let copies = ev.count_or_one("copies");
            let ttl = fields::required(ev.m, "ttl_ms", &root, &mut ev.issues)
                .and_then(|v| fields::count(v, &root.key("ttl_ms"), &mut ev.issues));
            match (hold, copies, ttl) {
                (Some(h), Some(c), Some(ttl)) => Some(Parsed::Op(Op::Transfer(h, c, ttl))),
                _ => None,
            }
        }
        Some("seize") => ev.string("transfer_id").map(|id| Parsed::Op(Op::Seize(id))),
        Some("get_capacity") => {
            let client = ev.string("client");
            let resource = ev.string("resource");
            let wants = fields::required(ev.m, "wants", &root, &mut ev.issues)
                .and_then(|v| fields::number(v, &root.key("wants"), &mut ev.issues));
            let has = match ev.m.get("has") {
                None | Some(Value::Null) => Some(0.0),
                Some(v) => fields::number(v, &root.key("has"), &mut ev.issues),
            };
            let subclients = ev.count_or_one("subclients");
            match (client, resource, wants, has, subclients) {
                (Some(c), Some(resource), Some(wants), Some(has), Some(subclients)) => {
                    // An explicit 0 is refused by the limiter (the proto's
                    // 0 means unset, a JSON 0 is written on purpose).
                    if subclients == 0 {
                        ev.issues
                            .push(&root.key("subclients"), "must be at least 1");
                        None
                    } else {
                        Some(Parsed::Op(Op::GetCapacity(
                            c,
                            CapacityAsk {
                                resource,
                                wants,
                                has,
                                subclients,
                            },
                        )))
                    }
                }
                _ => None,
            }
        }
        Some("release_capacity") => {
            let client = ev.string("client");
            let resource = ev.string("resource");
            client
                .zip(resource)
                .map(|(c, r)| Parsed::Op(Op::ReleaseCapacity(c, r)))
        }
        Some(_) => Some(Parsed::Op(Op::End)),
        None => None,
    };
    match (t, session, parsed) {
        (Some(t), Some(session), Some(parsed)) if ev.issues.is_empty() => Ok((t, session, parsed)),
        _ => Err(ConfigErrors(ev.issues.into_vec())),
    }
}

/// `copies` and `min_copies` together (SPEC §2 rule 5).
pub(crate) fn amount(copies: u64, min: u64) -> Result<Amount, String> {
    Amount::new(copies, min).map_err(|e: ClientError| e.to_string())
}

/// The fields of one event, read at the top level of its line.
struct Event<'a> {
    m: &'a Map<String, Value>,
    issues: Issues,
}

impl Event<'_> {
    fn string(&mut self, key: &str) -> Option<String> {
        let root = Path::root();
        fields::required(self.m, key, &root, &mut self.issues)
            .and_then(|v| fields::string(v, &root.key(key), &mut self.issues))
    }

    fn flag(&mut self, key: &str) -> bool {
        fields::boolean(self.m, key, &Path::root(), &mut self.issues)
    }

    fn count_or_one(&mut self, key: &str) -> Option<u64> {
        fields::count_or(self.m, key, 1, &Path::root(), &mut self.issues)
    }

    fn hold(&mut self) -> Option<Hold> {
        let resource = self.string("resource");
        let domain = self.string("domain");
        let groups = match self.m.get("groups") {
            None | Some(Value::Null) => Some(Vec::new()),
            Some(v) => fields::strings(v, &Path::root().key("groups"), &mut self.issues),
        };
        Some(Hold::new(resource?, domain?, groups?))
    }
}

/// What to echo for `t` or `op` in a reply: the value given if it is a
/// scalar, else null.
pub(crate) fn echo(v: Option<&Value>) -> Value {
    match v {
        Some(v @ (Value::Number(_) | Value::String(_) | Value::Bool(_))) => v.clone(),
        _ => Value::Null,
    }
}
