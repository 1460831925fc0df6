//! The peers' files as YAML read them: a document whose mapping keys keep
//! their type (envoyproxy/ratelimit refuses a key that is not a string,
//! which a JSON value cannot tell), turned into a JSON value for
//! `charon_core::fields` to check.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// A YAML document.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Yaml {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Yaml>),
    Map(Vec<(Yaml, Yaml)>),
}

impl Yaml {
    /// How a key or scalar is written in a message.
    pub(super) fn text(&self) -> String {
        match self {
            Yaml::Null => "null".into(),
            Yaml::Bool(b) => b.to_string(),
            Yaml::Int(n) => n.to_string(),
            Yaml::Float(f) => f.to_string(),
            Yaml::Str(s) => s.clone(),
            Yaml::Seq(_) => "a list".into(),
            Yaml::Map(_) => "a mapping".into(),
        }
    }

    /// The document as JSON: keys as their text (a key that is not a
    /// string is the reader's to refuse first).
    pub(super) fn to_json(&self) -> Value {
        match self {
            Yaml::Null => Value::Null,
            Yaml::Bool(b) => Value::Bool(*b),
            Yaml::Int(n) => match (u64::try_from(*n), i64::try_from(*n)) {
                (Ok(u), _) => u.into(),
                (_, Ok(i)) => i.into(),
                _ => serde_json::Number::from_f64(*n as f64).map_or(Value::Null, Value::Number),
            },
            Yaml::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Yaml::Str(s) => Value::String(s.clone()),
            Yaml::Seq(items) => Value::Array(items.iter().map(Yaml::to_json).collect()),
            Yaml::Map(entries) => {
                let mut m = Map::new();
                for (k, v) in entries {
                    m.insert(k.text(), v.to_json());
                }
                Value::Object(m)
            }
        }
    }
}

impl<'de> Deserialize<'de> for Yaml {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(YamlVisitor)
    }
}

struct YamlVisitor;

impl<'de> Visitor<'de> for YamlVisitor {
    type Value = Yaml;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML document")
    }

    fn visit_unit<E>(self) -> Result<Yaml, E> {
        Ok(Yaml::Null)
    }

    fn visit_none<E>(self) -> Result<Yaml, E> {
        Ok(Yaml::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Yaml, D::Error> {
        Yaml::deserialize(d)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Yaml, E> {
        Ok(Yaml::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Yaml, E> {
        Ok(Yaml::Int(n.into()))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Yaml, E> {
        Ok(Yaml::Int(n.into()))
    }

    fn visit_i128<E>(self, n: i128) -> Result<Yaml, E> {
        Ok(Yaml::Int(n))
    }

    fn visit_u128<E>(self, n: u128) -> Result<Yaml, E> {
        Ok(i128::try_from(n).map_or(Yaml::Float(n as f64), Yaml::Int))
    }

    fn visit_f64<E>(self, f: f64) -> Result<Yaml, E> {
        Ok(Yaml::Float(f))
    }

    fn visit_str<E>(self, s: &str) -> Result<Yaml, E> {
        Ok(Yaml::Str(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Yaml, E> {
        Ok(Yaml::Str(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Yaml, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Yaml::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Yaml, A::Error> {
        let mut entries = Vec::new();
        while let Some((k, v)) = map.next_entry()? {
            entries.push((k, v));
        }
        Ok(Yaml::Map(entries))
    }
}

/// Parses a peer's file, the way its own YAML reader would refuse it.
pub(super) fn parse(text: &str) -> Result<Yaml, String> {
    serde_saphyr::from_str::<Yaml>(text).map_err(|e| e.to_string())
}

/// Parses the same text into `T`, whose string fields keep the text of
/// their scalars as written (`0123`, `yes`): what the peers' readers give
/// a string field.
pub(super) fn typed<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    serde_saphyr::from_str::<T>(text).map_err(|e| e.to_string())
}
