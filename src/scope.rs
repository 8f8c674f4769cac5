//! What an API token may do: its [`Scope`], one of three ordered levels,
//! `read` < `operate` < `admin`, each allowing all the one below does.
//!
//! It lives at the bottom of the crate, beside `ids`, because the store
//! keeps it in each token's record (`storage::records::TokenRecord`), the
//! token table hands it out (`actors::tokens`), the HTTP layer decides with
//! it (which route needs which scope is the route table in `http/mod.rs`,
//! checked in `http/auth.rs`) and the CLI sends it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An API token's scope. Ordered: a token may do what its scope and every
/// lower one allow (`Read < Operate < Admin`).
///
/// Stored (bincode) by variant index: never reorder or remove variants,
/// only add above `Admin` (and think again about the order when doing so).
///
/// The default, what a token made without a scope gets and what a token
/// stored before scopes existed has, is `Admin`: everything, as every
/// token could then.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Every read: lists and shows, the event stream, metrics, health,
    /// the dashboard's views. Not instance logs (they show what a
    /// component prints, secrets included).
    Read,
    /// Read, plus the verbs on clusters and instances (create, start, stop,
    /// restart, scale, config, roles, upgrade, delete) and instance logs.
    Operate,
    /// Everything: packages, API tokens, nodes, join tokens and trust.
    #[default]
    Admin,
}

impl Scope {
    /// Every scope, lowest first.
    pub const ALL: [Scope; 3] = [Scope::Read, Scope::Operate, Scope::Admin];
    /// Their names, as the API, the CLI and the store's JSON spell them.
    pub const NAMES: [&'static str; 3] = ["read", "operate", "admin"];

    /// The name (`read`, `operate`, `admin`).
    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// Whether a token of this scope may do what needs `needed`.
    pub fn allows(self, needed: Scope) -> bool {
        self >= needed
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scope {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|scope| scope.as_str() == s).ok_or_else(|| {
            format!(
                "unknown scope {s:?}: the scopes are {} (each allows all the ones before it)",
                Self::NAMES.join(", ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_are_ordered_and_each_allows_those_below_only() {
        use Scope::*;
        assert!(Read < Operate && Operate < Admin);
        let allowed: Vec<(Scope, Scope)> = Scope::ALL
            .iter()
            .flat_map(|a| Scope::ALL.iter().map(move |b| (*a, *b)))
            .filter(|(a, b)| a.allows(*b))
            .collect();
        assert_eq!(
            allowed,
            [(Read, Read), (Operate, Read), (Operate, Operate), (Admin, Read), (Admin, Operate), (Admin, Admin)]
        );
        assert_eq!(Scope::default(), Admin);
    }

    #[test]
    fn names_parse_print_and_serialize_alike() {
        for (scope, name) in Scope::ALL.into_iter().zip(Scope::NAMES) {
            assert_eq!(scope.to_string(), name);
            assert_eq!(name.parse::<Scope>(), Ok(scope));
            assert_eq!(serde_json::to_string(&scope).unwrap(), format!("\"{name}\""));
        }
        let err = "root".parse::<Scope>().unwrap_err();
        assert!(err.contains("\"root\"") && err.contains("read, operate, admin"), "{err}");
        assert!("Admin".parse::<Scope>().is_err(), "names are lowercase only");
    }
}
