//! Typed identifiers. Every id that crosses a module boundary is one of these
//! newtypes, never a bare `String` or `Uuid`, so a node id can't be passed
//! where an instance id is expected.
//!
//! Names given by users (clusters, roles, packages) are checked by
//! [`validate_name`]; generated ids are built only from validated names and
//! random hex, so they are always safe as path components on the agent.

use std::fmt;

use serde::{Deserialize, Serialize};

/// At most this many labels on a node, or required of one by a role; each
/// name and value is a [`validate_name`] name.
pub const MAX_LABELS: usize = 64;

/// Checks a set of labels: at most [`MAX_LABELS`], each name and value a
/// [`validate_name`] name. The error names the label at fault (`None`: the
/// set as a whole), with what is wrong.
pub fn validate_labels<'a>(
    labels: impl ExactSizeIterator<Item = (&'a String, &'a String)>,
) -> Result<(), (Option<String>, String)> {
    if labels.len() > MAX_LABELS {
        return Err((None, format!("at most {MAX_LABELS} labels, got {}", labels.len())));
    }
    for (k, v) in labels {
        let at = || Some(shorten(k, 64));
        validate_name(k).map_err(|m| (at(), format!("invalid label name: {m}")))?;
        validate_name(v).map_err(|m| (at(), format!("invalid label value: {m}")))?;
    }
    Ok(())
}

/// Checks a user-facing name: `[a-z0-9][a-z0-9-]{0,62}` (the API
/// description says so as a pattern: `http/dto.rs`, `http/packages.rs`).
///
/// Returns a message describing the violation (the caller adds the field).
pub fn validate_name(name: &str) -> Result<(), String> {
    let bytes = name.as_bytes();
    if bytes.is_empty() {
        return Err("must not be empty".into());
    }
    if bytes.len() > 63 {
        return Err(format!("must be at most 63 characters, got {}", bytes.len()));
    }
    if !(bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit()) {
        return Err("must start with a lowercase letter or a digit ([a-z0-9][a-z0-9-]{0,62})".into());
    }
    if let Some(bad) = name.chars().find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')) {
        return Err(format!("must match [a-z0-9][a-z0-9-]{{0,62}}; {bad:?} is not allowed"));
    }
    Ok(())
}

/// At most `max` characters of `s` for a message, with how many were left
/// out: an id or a name from a request may be 10,000 characters long, and
/// an error message echoing it whole would be mostly that.
pub fn shorten(s: &str, max: usize) -> String {
    let total = s.chars().count();
    if total <= max {
        return s.to_string();
    }
    let head: String = s.chars().take(max).collect();
    format!("{head}... ({} more characters)", total - max)
}

/// Checks a package version: 1..=64 chars of `[A-Za-z0-9._+-]`, not starting with `.`.
pub fn validate_version(version: &str) -> Result<(), String> {
    if version.is_empty() || version.len() > 64 {
        return Err("must be 1 to 64 characters".into());
    }
    if version.starts_with('.') {
        return Err("must not start with '.'".into());
    }
    if let Some(bad) = version.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-'))) {
        return Err(format!("must match [A-Za-z0-9._+-]+; {bad:?} is not allowed"));
    }
    Ok(())
}

/// A shared, immutable string id: cloning one (into an index, a snapshot,
/// a message) bumps a counter instead of copying the text, which matters
/// when a master holds 100,000 instances, each id kept in several indexes.
macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(std::sync::Arc<str>);

        impl $name {
            /// Wraps an already-validated string.
            pub fn new(s: impl Into<String>) -> Self {
                Self(std::sync::Arc::from(s.into()))
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

string_id!(
    /// A node (agent) id, chosen in the agent's config, e.g. `node-1`.
    NodeId
);
string_id!(
    /// An instance id, unique for all time: `<cluster>-<role>-<ordinal>-<6 hex of the cluster id>`.
    /// It names the instance directory on the agent.
    InstanceId
);

impl InstanceId {
    /// Builds the id of ordinal `ordinal` of `role` in cluster `cluster_name` / `cluster_id`.
    pub fn generate(cluster_name: &str, cluster_id: &ClusterId, role: &str, ordinal: u32) -> Self {
        let short = &cluster_id.0.simple().to_string()[..6];
        Self::new(format!("{cluster_name}-{role}-{ordinal}-{short}"))
    }

    /// True when this id is safe as one path component (agent side check of
    /// ids received over the wire).
    pub fn is_safe_path_component(&self) -> bool {
        !self.0.is_empty()
            && self.0.len() <= 160
            && self.0.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    }
}

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident, $new:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub uuid::Uuid);

        impl $name {
            pub fn random() -> Self {
                Self($new)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl std::str::FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                uuid::Uuid::parse_str(s).map(Self)
            }
        }
    };
}

uuid_id!(
    /// A cluster's id; the name can be reused after delete, the id never is.
    ClusterId,
    uuid::Uuid::new_v4()
);
uuid_id!(
    /// An operation's id: a UUIDv7, so ids sort by creation time (at the
    /// millisecond; random bits after).
    OperationId,
    uuid::Uuid::now_v7()
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rule() {
        assert!(validate_name("zk-1").is_ok());
        assert!(validate_name("0abc").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("-a").is_err());
        assert!(validate_name("Abc").is_err());
        assert!(validate_name("a_b").is_err());
        assert!(validate_name("a/b").is_err());
        assert!(validate_name(&"a".repeat(63)).is_ok());
        assert!(validate_name(&"a".repeat(64)).is_err());
    }

    #[test]
    fn versions_follow_the_rule() {
        assert!(validate_version("3.8.0").is_ok());
        assert!(validate_version("1.0.0-rc1+b2").is_ok());
        assert!(validate_version("../x").is_err());
        assert!(validate_version("a/b").is_err());
        assert!(validate_version("").is_err());
    }

    #[test]
    fn instance_ids_are_safe_path_components() {
        let cid = ClusterId::random();
        let id = InstanceId::generate("web", &cid, "server", 3);
        assert!(id.as_str().starts_with("web-server-3-"));
        assert!(id.is_safe_path_component());
        assert!(!InstanceId::new("../etc").is_safe_path_component());
        assert!(!InstanceId::new("").is_safe_path_component());
    }
}
