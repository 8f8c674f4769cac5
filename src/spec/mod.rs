//! The component spec (`component.toml` at a package root, DESIGN.md §8):
//! its model, its validation, typed config values and template rendering.
//!
//! A package is only accepted when its spec parses and passes every rule
//! here, so actors and operations can use a [`ComponentSpec`] without
//! re-checking it. Every violation is one [`SpecError`] naming the offending
//! field as a dotted path (`roles.server.count.max`) and the rule it breaks.
//!
//! | file | owns |
//! |---|---|
//! | `raw.rs` | the serde shape of the TOML: unknown keys, types, field paths |
//! | `model.rs` | [`ComponentSpec`] and the per-role domain rules |
//! | `checks.rs` | small validators: names, paths, argv, durations, sizes |
//! | `config.rs` | typed config parameters and resolving a cluster's values |
//! | `render.rs` | the template context and minijinja rendering |

pub mod checks;
pub mod config;
pub mod model;
mod raw;
pub mod render;

#[cfg(test)]
mod tests;

pub use config::{ConfigParam, ConfigType};
pub use model::{ChangeMode, ComponentInfo, ComponentSpec, CountRule, FileSpec, HealthCheck, Resources, RoleSpec};

/// A spec rule violation: which field, and what rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    /// A dotted path into the spec or the request, e.g. `config.tick_time.default`.
    pub field: String,
    pub message: String,
}

impl SpecError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        SpecError { field: field.into(), message: message.into() }
    }
}

impl From<SpecError> for crate::error::Error {
    fn from(e: SpecError) -> Self {
        crate::error::Error::SpecViolation { field: e.field, message: e.message }
    }
}
