//! The literal shape of `component.toml`, as serde reads it, before any rule
//! beyond "right keys, right types" is checked.
//!
//! Kept apart from the typed model so that serde's job (unknown keys, type
//! errors, with exact field paths via `serde_path_to_error`) and the domain
//! rules in `model.rs` don't mix. Every struct refuses unknown keys.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_path_to_error::Segment;

use super::SpecError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSpec {
    pub component: RawComponent,
    #[serde(default)]
    pub config: BTreeMap<String, RawParam>,
    #[serde(default)]
    pub roles: Vec<RawRole>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawComponent {
    pub name: String,
    pub version: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawParam {
    #[serde(rename = "type")]
    pub kind: String,
    pub default: Option<toml::Value>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub choices: Option<Vec<String>>,
    pub description: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCount {
    pub min: Option<u32>,
    pub max: Option<u32>,
    #[serde(default)]
    pub odd: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawResources {
    /// A string with a suffix (`"512M"`) or an integer number of bytes.
    pub memory: Option<toml::Value>,
    pub cpu: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHealth {
    pub tcp: Option<String>,
    pub cmd: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFile {
    pub path: String,
    pub template: String,
    pub mode: Option<u32>,
    /// `restart`, `reload`, `signal` or `noop` (also `none`; Nomad's template `change_mode`).
    pub change_mode: Option<String>,
    /// With `change_mode = "signal"`: e.g. `SIGHUP`.
    pub change_signal: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRole {
    pub name: String,
    #[serde(default)]
    pub order: i32,
    pub count: Option<RawCount>,
    pub run_as: Option<String>,
    #[serde(default)]
    pub ports: Vec<String>,
    pub start: Vec<String>,
    pub pidfile: Option<String>,
    pub stop: Option<Vec<String>>,
    pub stop_grace: Option<String>,
    pub start_timeout: Option<String>,
    /// A foreground process that exits within this is a failed start.
    pub start_settle: Option<String>,
    pub resources: Option<RawResources>,
    pub health: Option<RawHealth>,
    pub init: Option<Vec<String>>,
    pub scale_out: Option<Vec<String>>,
    pub scale_in: Option<Vec<String>>,
    pub reload: Option<Vec<String>>,
    pub destroy: Option<Vec<String>>,
    pub hook_timeout: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub files: Vec<RawFile>,
    /// Labels a node must carry to hold the role's instances.
    #[serde(default)]
    pub node_labels: BTreeMap<String, String>,
}

/// The field name used for errors about the document as a whole.
pub const DOCUMENT: &str = "component.toml";

/// Parses the TOML text and deserializes it into [`RawSpec`].
///
/// A syntax error names line and column; a shape error names the dotted path
/// of the offending key, with a role written by its name
/// (`roles.server.count.max`) when the role has a string `name`.
pub fn parse(text: &str) -> Result<RawSpec, SpecError> {
    let table: toml::Table = toml::from_str(text).map_err(|e| {
        let message = match e.span() {
            Some(span) => {
                let (line, column) = line_column(text, span.start);
                format!("TOML syntax error at line {line}, column {column}: {}", e.message())
            }
            None => format!("TOML syntax error: {}", e.message()),
        };
        SpecError::new(DOCUMENT, message)
    })?;
    let role_names: Vec<Option<String>> = match table.get("roles") {
        Some(toml::Value::Array(roles)) => {
            roles.iter().map(|r| r.get("name").and_then(|n| n.as_str()).map(str::to_owned)).collect()
        }
        _ => Vec::new(),
    };
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
        let field = field_path(e.path(), &role_names);
        SpecError::new(field, e.inner().message().to_owned())
    })
}

/// 1-based line and column (in characters) of byte offset `at` in `text`.
fn line_column(text: &str, at: usize) -> (usize, usize) {
    let before = text.get(..at).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// Writes a serde path as the dotted field of DESIGN.md's errors. The index
/// right after `roles` becomes the role's name when it is a plain name, so a
/// user reads `roles.server.count` instead of `roles[0].count`.
fn field_path(path: &serde_path_to_error::Path, role_names: &[Option<String>]) -> String {
    let mut out = String::new();
    let mut after_roles = false;
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => {
                let name = role_names.get(*index).and_then(|n| n.as_deref());
                match name {
                    Some(name) if after_roles && crate::ids::validate_name(name).is_ok() => {
                        out.push('.');
                        out.push_str(name);
                    }
                    _ => out.push_str(&format!("[{index}]")),
                }
                after_roles = false;
            }
            Segment::Map { key } | Segment::Enum { variant: key } => {
                after_roles = out.is_empty() && key == "roles";
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => {
                after_roles = false;
                if !out.is_empty() {
                    out.push('.');
                }
                out.push('?');
            }
        }
    }
    if out.is_empty() { DOCUMENT.to_owned() } else { out }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syntax_errors_name_line_and_column() {
        let err = parse("[component]\nname = \"zk\"\nname = \"x\"\n").unwrap_err();
        assert_eq!(err.field, DOCUMENT);
        assert!(err.message.contains("line 3, column 1"), "{err}");
        assert!(err.message.contains("duplicate key"), "{err}");
    }

    #[test]
    fn unknown_keys_are_refused_with_their_path() {
        let text = "[component]\nname = \"zk\"\nversion = \"1\"\n[[roles]]\nname = \"server\"\nstart = [\"x\"]\ncount = { min = 1, maxx = 3 }\n";
        let err = parse(text).unwrap_err();
        assert_eq!(err.field, "roles.server.count.maxx");
        assert!(err.message.contains("unknown field `maxx`"), "{err}");

        let err = parse("[component]\nname = \"zk\"\nversion = \"1\"\nlicense = \"x\"\n").unwrap_err();
        assert_eq!(err.field, "component.license");
        assert!(err.message.contains("unknown field"), "{err}");

        let err = parse("[component]\nname = \"zk\"\nversion = \"1\"\n[extra]\n").unwrap_err();
        assert_eq!(err.field, "extra");
    }

    #[test]
    fn type_errors_name_the_field() {
        let text = "[component]\nname = \"zk\"\nversion = \"1\"\n[[roles]]\nname = \"a\"\nstart = [\"x\"]\n[[roles]]\nname = \"web\"\nstart = [\"x\"]\n[[roles.files]]\npath = \"p\"\ntemplate = \"t\"\nmode = \"0644\"\n";
        let err = parse(text).unwrap_err();
        assert_eq!(err.field, "roles.web.files[0].mode");
        assert!(err.message.contains("invalid type"), "{err}");
    }

    #[test]
    fn missing_fields_are_named() {
        let err = parse("[component]\nname = \"zk\"\nversion = \"1\"\n[[roles]]\nname = \"a\"\n").unwrap_err();
        assert_eq!(err.field, "roles.a");
        assert!(err.message.contains("missing field `start`"), "{err}");
        let err = parse("").unwrap_err();
        assert_eq!(err.field, DOCUMENT);
        assert!(err.message.contains("missing field `component`"), "{err}");
    }
}
