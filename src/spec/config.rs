//! Typed config parameters (`[config]` of `component.toml`) and the checks
//! that turn a cluster's requested JSON values into validated
//! [`ConfigValue`]s.
//!
//! The rules are written once here and used three ways: for the spec's own
//! defaults at parse time, for the values an API request gives, and for the
//! values a cluster already holds when its spec changes (upgrade).

use std::collections::BTreeMap;

use serde_json::Value as Json;

use super::SpecError;
use super::checks::check_param_name;
use super::raw::RawParam;
use crate::storage::records::ConfigValue;

/// The type of a config parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigType {
    Int,
    Float,
    Bool,
    String,
    /// A string never shown back (`ConfigValue::Secret`), with no default
    /// (a default would be in the package, for anyone to read).
    Secret,
}

impl ConfigType {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "int" => Some(Self::Int),
            "float" => Some(Self::Float),
            "bool" => Some(Self::Bool),
            "string" => Some(Self::String),
            "secret" => Some(Self::Secret),
            _ => None,
        }
    }

    /// The name used in `component.toml` and in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Int => "int",
            Self::Float => "float",
            Self::Bool => "bool",
            Self::String => "string",
            Self::Secret => "secret",
        }
    }
}

/// One parameter a cluster may set.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigParam {
    pub kind: ConfigType,
    pub default: Option<ConfigValue>,
    /// Inclusive bounds, for `int` and `float` only.
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// The allowed values, for `string` only.
    pub choices: Option<Vec<String>>,
    pub description: Option<String>,
}

impl ConfigParam {
    /// Validates one `[config]` entry named `name`.
    pub(super) fn from_raw(name: &str, raw: RawParam) -> Result<Self, SpecError> {
        let field = format!("config.{name}");
        check_param_name(name).map_err(|m| SpecError::new(&field, format!("invalid parameter name: {m}")))?;
        let kind = ConfigType::parse(&raw.kind).ok_or_else(|| {
            SpecError::new(
                format!("{field}.type"),
                format!("unknown type {:?}; expected int, float, bool, string or secret", raw.kind),
            )
        })?;
        let numeric = matches!(kind, ConfigType::Int | ConfigType::Float);
        for (key, bound) in [("min", raw.min), ("max", raw.max)] {
            let Some(bound) = bound else { continue };
            if !numeric {
                return Err(SpecError::new(
                    format!("{field}.{key}"),
                    format!("{key} applies only to int and float parameters, not {}", kind.name()),
                ));
            }
            if !bound.is_finite() {
                return Err(SpecError::new(format!("{field}.{key}"), format!("{key} must be a finite number")));
            }
        }
        if let (Some(min), Some(max)) = (raw.min, raw.max)
            && min > max
        {
            return Err(SpecError::new(format!("{field}.min"), format!("min {min} must not exceed max {max}")));
        }
        if let Some(choices) = &raw.choices {
            let cfield = format!("{field}.choices");
            if kind != ConfigType::String {
                return Err(SpecError::new(
                    cfield,
                    format!("choices apply only to string parameters, not {}", kind.name()),
                ));
            }
            if choices.is_empty() {
                return Err(SpecError::new(cfield, "choices must not be empty"));
            }
            for (i, c) in choices.iter().enumerate() {
                if choices[..i].contains(c) {
                    return Err(SpecError::new(cfield, format!("duplicate choice {c:?}")));
                }
            }
        }
        let mut param = ConfigParam {
            kind,
            default: None,
            min: raw.min,
            max: raw.max,
            choices: raw.choices,
            description: raw.description,
        };
        if kind == ConfigType::Secret && raw.default.is_some() {
            return Err(SpecError::new(
                format!("{field}.default"),
                "a secret has no default: it would be in the package for anyone to read; clusters give it",
            ));
        }
        if let Some(default) = raw.default {
            let dfield = format!("{field}.default");
            let value = param.value_from_toml(&default).map_err(|m| SpecError::new(&dfield, m))?;
            param.check(&value).map_err(|m| SpecError::new(&dfield, m))?;
            param.default = Some(value);
        }
        Ok(param)
    }

    /// Types a TOML value; an integer is accepted for a float.
    fn value_from_toml(&self, v: &toml::Value) -> Result<ConfigValue, String> {
        let value = match (self.kind, v) {
            (ConfigType::Int, toml::Value::Integer(i)) => ConfigValue::Int(*i),
            (ConfigType::Float, toml::Value::Integer(i)) => ConfigValue::Float(*i as f64),
            (ConfigType::Float, toml::Value::Float(f)) => ConfigValue::Float(*f),
            (ConfigType::Bool, toml::Value::Boolean(b)) => ConfigValue::Bool(*b),
            (ConfigType::String, toml::Value::String(s)) => ConfigValue::Str(s.clone()),
            (kind, other) => {
                return Err(format!("wrong type: expected {}, got {} {other}", kind.name(), other.type_str()));
            }
        };
        Ok(value)
    }

    /// Types a JSON value: an int takes only JSON integers, a float any number.
    pub fn value_from_json(&self, v: &Json) -> Result<ConfigValue, String> {
        let value = match (self.kind, v) {
            (ConfigType::Int, Json::Number(n)) if n.is_i64() || n.is_u64() => {
                ConfigValue::Int(n.as_i64().ok_or_else(|| format!("{n} is out of the range of a 64-bit int"))?)
            }
            (ConfigType::Float, Json::Number(n)) => {
                ConfigValue::Float(n.as_f64().ok_or_else(|| format!("{n} is not a representable float"))?)
            }
            (ConfigType::Bool, Json::Bool(b)) => ConfigValue::Bool(*b),
            (ConfigType::String, Json::String(s)) => ConfigValue::Str(s.clone()),
            (ConfigType::Secret, Json::String(s)) => ConfigValue::Secret(s.clone()),
            // Never echo what was given for a secret.
            (ConfigType::Secret, other) => {
                return Err(format!("wrong type: expected a secret (a string), got {}", json_type(other)));
            }
            (kind, other) => {
                return Err(format!("wrong type: expected {}, got {} {other}", kind.name(), json_type(other)));
            }
        };
        Ok(value)
    }

    /// Checks a typed value against this parameter's type, bounds and choices.
    pub fn check(&self, value: &ConfigValue) -> Result<(), String> {
        let number = match (self.kind, value) {
            (ConfigType::Int, ConfigValue::Int(i)) => Some(*i as f64),
            (ConfigType::Float, ConfigValue::Float(f)) => {
                if !f.is_finite() {
                    return Err("must be a finite number".into());
                }
                Some(*f)
            }
            (ConfigType::Bool, ConfigValue::Bool(_)) | (ConfigType::Secret, ConfigValue::Secret(_)) => None,
            // A secret a newer version declares a plain string stays hidden:
            // an upgrade must not be a way to read it back.
            (ConfigType::String, ConfigValue::Secret(_)) => None,
            (ConfigType::String, ConfigValue::Str(s)) => {
                if let Some(choices) = &self.choices
                    && !choices.contains(s)
                {
                    return Err(format!("{s:?} is not one of the choices {choices:?}"));
                }
                None
            }
            (kind, other) => return Err(format!("wrong type: expected {}, got {other:?}", kind.name())),
        };
        if let Some(n) = number {
            if let Some(min) = self.min
                && n < min
            {
                return Err(format!("{n} is below the minimum {min}"));
            }
            if let Some(max) = self.max
                && n > max
            {
                return Err(format!("{n} is above the maximum {max}"));
            }
        }
        Ok(())
    }
}

/// The JSON type of a value, for messages.
fn json_type(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "bool",
        Json::Number(n) if n.is_f64() => "float",
        Json::Number(_) => "int",
        Json::String(_) => "string",
        Json::Array(_) => "array",
        Json::Object(_) => "object",
    }
}

/// Resolves a cluster's config against `params`: `given` values first, then
/// `base` (the cluster's current values), then defaults. Unknown keys, wrong
/// types, out-of-bound values and unset required parameters are errors; keys
/// of `base` the spec no longer declares are dropped.
pub(super) fn resolve(
    params: &BTreeMap<String, ConfigParam>,
    given: &BTreeMap<String, Json>,
    base: Option<&BTreeMap<String, ConfigValue>>,
) -> Result<BTreeMap<String, ConfigValue>, SpecError> {
    if let Some(unknown) = given.keys().find(|k| !params.contains_key(*k)) {
        let known: Vec<&str> = params.keys().map(String::as_str).collect();
        return Err(SpecError::new(
            format!("config.{unknown}"),
            format!("unknown config parameter; the component declares: [{}]", known.join(", ")),
        ));
    }
    let mut out = BTreeMap::new();
    for (name, param) in params {
        let field = format!("config.{name}");
        let value = match (given.get(name), base.and_then(|b| b.get(name)), &param.default) {
            // A secret given back as the API shows it keeps its value, so a
            // config read and sent back whole changes nothing.
            (Some(json), Some(current), _)
                if current.is_secret() && *json == crate::storage::records::secret_shown() =>
            {
                current.clone()
            }
            (Some(json), _, _) => param.value_from_json(json).map_err(|m| SpecError::new(&field, m))?,
            // A parameter that became a secret in a new version keeps its
            // value, hidden from now on; one that stopped being one stays
            // hidden.
            (None, Some(current), _) => match (param.kind, current) {
                (ConfigType::Secret, ConfigValue::Str(s)) => ConfigValue::Secret(s.clone()),
                (ConfigType::String, ConfigValue::Secret(s)) => ConfigValue::Secret(s.clone()),
                _ => current.clone(),
            },
            (None, None, Some(default)) => default.clone(),
            (None, None, None) => {
                return Err(SpecError::new(field, "required: the parameter has no default, give a value"));
            }
        };
        param.check(&value).map_err(|m| SpecError::new(&field, m))?;
        out.insert(name.clone(), value);
    }
    Ok(out)
}

/// Hides the values `params` declares `secret` that are still plain
/// strings: an upgrade to a version that makes a parameter a secret keeps
/// its value and shows it only as set from then on.
pub fn hide_secrets(config: &mut BTreeMap<String, ConfigValue>, params: &BTreeMap<String, ConfigParam>) {
    for (name, value) in config.iter_mut() {
        if let (Some(ConfigParam { kind: ConfigType::Secret, .. }), ConfigValue::Str(s)) = (params.get(name), &*value) {
            *value = ConfigValue::Secret(s.clone());
        }
    }
}
