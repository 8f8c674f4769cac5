//! A cluster's typed config values, and what of them readers see: a
//! `secret` only as set.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A typed config value, as validated against the component spec.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub enum ConfigValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    /// A `secret` parameter's value (a password, a key): rendered into the
    /// instances' files, never shown by the API, events, operation records
    /// or logs ([`ConfigValue::to_public_json`], and its `Debug`). Added
    /// last, so records written before it decode unchanged.
    Secret(String),
}

/// What the API shows of a secret value.
pub fn secret_shown() -> serde_json::Value {
    serde_json::json!({ "secret": "set" })
}

impl ConfigValue {
    /// The value itself, for templates.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            ConfigValue::Int(i) => serde_json::Value::from(*i),
            ConfigValue::Float(f) => serde_json::Value::from(*f),
            ConfigValue::Bool(b) => serde_json::Value::from(*b),
            ConfigValue::Str(s) | ConfigValue::Secret(s) => serde_json::Value::from(s.clone()),
        }
    }

    /// The value as anything but a template sees it: a secret is only
    /// `{"secret": "set"}`.
    pub fn to_public_json(&self) -> serde_json::Value {
        match self {
            ConfigValue::Secret(_) => secret_shown(),
            other => other.to_json(),
        }
    }

    pub fn is_secret(&self) -> bool {
        matches!(self, ConfigValue::Secret(_))
    }
}

/// Never prints a secret (records and operation plans are `Debug`-logged).
impl std::fmt::Debug for ConfigValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigValue::Int(i) => f.debug_tuple("Int").field(i).finish(),
            ConfigValue::Float(x) => f.debug_tuple("Float").field(x).finish(),
            ConfigValue::Bool(b) => f.debug_tuple("Bool").field(b).finish(),
            ConfigValue::Str(s) => f.debug_tuple("Str").field(s).finish(),
            ConfigValue::Secret(_) => f.write_str("Secret(<hidden>)"),
        }
    }
}

/// `values` (as a request gave them) with the keys whose resolved value in
/// `typed` is a secret shown as [`secret_shown`]: what an operation record
/// keeps of its parameters.
pub fn mask_secrets(
    values: &BTreeMap<String, serde_json::Value>,
    typed: &BTreeMap<String, ConfigValue>,
) -> BTreeMap<String, serde_json::Value> {
    values
        .iter()
        .map(|(k, v)| {
            let shown = if typed.get(k).is_some_and(ConfigValue::is_secret) { secret_shown() } else { v.clone() };
            (k.clone(), shown)
        })
        .collect()
}
