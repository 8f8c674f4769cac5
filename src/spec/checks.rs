//! Small, pure validators for the values a `component.toml` may hold: names,
//! relative paths, argv arrays, durations and memory sizes.
//!
//! They live apart from the model so each rule is written once and tested on
//! its own; the agent re-checks paths it receives with [`check_relative_path`]
//! ("validated on both sides", DESIGN.md §10). Every function returns the
//! message of the violated rule; the caller adds the field.

use std::time::Duration;

/// The most bytes a relative path in the spec (pidfile, rendered file) may have.
pub const MAX_PATH_BYTES: usize = 255;

/// The directories flotilla owns in every instance directory (DESIGN.md §12).
pub const RESERVED_DIRS: [&str; 3] = ["data", "logs", "run"];

/// The longest duration a timeout or grace period may have.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);

/// The smallest memory limit that makes sense for a process tree.
pub const MIN_MEMORY_BYTES: u64 = 4 * 1024 * 1024;

/// Checks `s` against `[first][rest]{0,max_rest}`, where `first` and `rest`
/// are character predicates. `pattern` is the rule's text, for the message.
fn check_pattern(
    s: &str,
    first: impl Fn(char) -> bool,
    rest: impl Fn(char) -> bool,
    max_rest: usize,
    pattern: &str,
) -> Result<(), String> {
    let mut chars = s.chars();
    let ok = match chars.next() {
        None => false,
        Some(c) => first(c) && s.len() <= max_rest + 1 && chars.all(rest),
    };
    if ok { Ok(()) } else { Err(format!("{s:?} must match {pattern}")) }
}

/// A port name: `[a-z][a-z0-9_]{0,31}`.
pub fn check_port_name(s: &str) -> Result<(), String> {
    check_pattern(
        s,
        |c| c.is_ascii_lowercase(),
        |c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_',
        31,
        "[a-z][a-z0-9_]{0,31}",
    )
}

/// A config parameter name: `[a-z][a-z0-9_]{0,63}`.
pub fn check_param_name(s: &str) -> Result<(), String> {
    check_pattern(
        s,
        |c| c.is_ascii_lowercase(),
        |c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_',
        63,
        "[a-z][a-z0-9_]{0,63}",
    )
}

/// A user name to run as: `[a-z_][a-z0-9_-]{0,31}`.
pub fn check_user_name(s: &str) -> Result<(), String> {
    check_pattern(
        s,
        |c| c.is_ascii_lowercase() || c == '_',
        |c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-',
        31,
        "[a-z_][a-z0-9_-]{0,31}",
    )
}

/// An environment variable name: `[A-Za-z_][A-Za-z0-9_]*` (at most 255 bytes).
pub fn check_env_name(s: &str) -> Result<(), String> {
    check_pattern(
        s,
        |c| c.is_ascii_alphabetic() || c == '_',
        |c| c.is_ascii_alphanumeric() || c == '_',
        254,
        "[A-Za-z_][A-Za-z0-9_]*",
    )
}

/// A path relative to the instance directory that flotilla writes or reads:
/// not absolute, no `.`/`..`/empty components, no NUL, at most 255 bytes.
pub fn check_relative_path(p: &str) -> Result<(), String> {
    if p.is_empty() {
        return Err("path must not be empty".into());
    }
    if p.len() > MAX_PATH_BYTES {
        return Err(format!("path must be at most {MAX_PATH_BYTES} bytes, got {}", p.len()));
    }
    if p.contains('\0') {
        return Err("path must not contain NUL".into());
    }
    if p.starts_with('/') {
        return Err(format!("path {p:?} must be relative to the instance directory, not absolute"));
    }
    for component in p.split('/') {
        match component {
            "" => return Err(format!("path {p:?} must not have empty components")),
            "." | ".." => {
                return Err(format!("path {p:?} must not have `.` or `..` components"));
            }
            _ => {}
        }
    }
    Ok(())
}

/// A rendered file's path: a relative path outside the directories the
/// instance owns (`data`, `logs`, `run`): the agent, root, writes rendered
/// files, and those three are the instance's own to fill (a start script
/// may copy a rendered file there, e.g. ZooKeeper's `conf/myid`).
pub fn check_file_path(p: &str) -> Result<(), String> {
    check_relative_path(p)?;
    let first = p.split('/').next().unwrap_or(p);
    if RESERVED_DIRS.contains(&first) {
        return Err(format!(
            "path {p:?} is inside {first}/, which the instance owns (data, logs, run): a rendered file goes elsewhere, e.g. conf/"
        ));
    }
    Ok(())
}

/// A pidfile's path: a relative path that is not one of the directories
/// the instance owns itself (a pidfile inside `run/` is the usual place).
pub fn check_pidfile_path(p: &str) -> Result<(), String> {
    check_relative_path(p)?;
    if RESERVED_DIRS.contains(&p) {
        return Err(format!("path {p:?} is a directory the instance owns (data, logs, run); name a file inside it"));
    }
    Ok(())
}

/// Where a problem in an argv array is: the whole array or one element.
#[derive(Debug, PartialEq, Eq)]
pub enum ArgvProblem {
    Whole(String),
    Element(usize, String),
}

/// An argv array: non-empty; every element non-empty and without NUL;
/// `argv[0]` absolute, a relative path without `..` or empty components
/// (relative to the instance directory), or a bare program name (PATH).
pub fn check_argv(argv: &[String]) -> Result<(), ArgvProblem> {
    if argv.is_empty() {
        return Err(ArgvProblem::Whole("command must not be empty (an argv array, e.g. [\"bin/start.sh\"])".into()));
    }
    for (i, arg) in argv.iter().enumerate() {
        if arg.is_empty() {
            return Err(ArgvProblem::Element(i, "argument must not be empty".into()));
        }
        if arg.contains('\0') {
            return Err(ArgvProblem::Element(i, "argument must not contain NUL".into()));
        }
    }
    let program = argv[0].as_str();
    let relative = program.strip_prefix('/').unwrap_or(program);
    if program.contains('/') && relative.split('/').any(|c| c.is_empty() || c == "..") {
        return Err(ArgvProblem::Element(
            0,
            format!(
                "program {program:?} must be an absolute path, a relative path without `..` or empty components, or a program name"
            ),
        ));
    }
    Ok(())
}

/// A humantime duration (`"10s"`, `"1m 30s"`), greater than zero and at most an hour.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("invalid duration {s:?} ({e}); write e.g. \"10s\""))?;
    if d.is_zero() {
        return Err("duration must be greater than zero".into());
    }
    if d > MAX_DURATION {
        return Err(format!("duration {s:?} must be at most 1h"));
    }
    Ok(d)
}

/// A memory size: plain bytes or a number with a binary suffix K, M, G or T
/// (`"512M"` = 512 MiB), at least 4 MiB.
pub fn parse_memory(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, multiplier) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("memory {s:?}: unknown suffix {c:?}; use K, M, G or T")),
            };
            (&s[..i], 1u64 << shift)
        }
        _ => (s, 1),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!("memory {s:?} must be a whole number of bytes or end in K, M, G or T, e.g. \"512M\""));
    }
    let bytes = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(|| format!("memory {s:?} is too large"))?;
    check_memory(bytes)?;
    Ok(bytes)
}

/// A memory limit in bytes must be at least 4 MiB.
pub fn check_memory(bytes: u64) -> Result<(), String> {
    if bytes < MIN_MEMORY_BYTES {
        return Err(format!("memory must be at least 4M ({MIN_MEMORY_BYTES} bytes), got {bytes} bytes"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn names() {
        assert!(check_port_name("client").is_ok());
        assert!(check_port_name("peer_2").is_ok());
        assert!(check_port_name("2peer").is_err());
        assert!(check_port_name("Peer").is_err());
        assert!(check_port_name(&"a".repeat(32)).is_ok());
        assert!(check_port_name(&"a".repeat(33)).is_err());
        assert!(check_param_name(&"a".repeat(64)).is_ok());
        assert!(check_param_name(&"a".repeat(65)).is_err());
        assert!(check_param_name("tick-time").is_err());
        assert!(check_user_name("_zk-user1").is_ok());
        assert!(check_user_name("root!").is_err());
        assert!(check_user_name("").is_err());
        assert!(check_env_name("ZOO_LOG_DIR").is_ok());
        assert!(check_env_name("_x1").is_ok());
        assert!(check_env_name("1X").is_err());
        assert!(check_env_name("A-B").is_err());
    }

    #[test]
    fn relative_paths() {
        assert!(check_file_path("conf/zoo.cfg").is_ok());
        assert!(check_file_path("conf/myid").is_ok());
        assert!(check_file_path("database/x").is_ok(), "only the directories themselves are the instance's");
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "a/",
            "./a",
            "a\0b",
            "data",
            "logs",
            "run",
            "data/myid",
            "run/x/y",
        ] {
            assert!(check_file_path(bad).is_err(), "{bad:?} accepted");
        }
        assert!(check_relative_path(&"a".repeat(255)).is_ok());
        assert!(check_relative_path(&"a".repeat(256)).unwrap_err().contains("255"));
    }

    #[test]
    fn argv_rules() {
        assert!(check_argv(&argv(&["/usr/bin/python3", "-m", "http.server"])).is_ok());
        assert!(check_argv(&argv(&["bin/zk-start.sh"])).is_ok());
        assert!(check_argv(&argv(&["./bin/zk-start.sh"])).is_ok());
        assert!(check_argv(&argv(&["sleep", "100"])).is_ok());
        assert!(matches!(check_argv(&[]), Err(ArgvProblem::Whole(_))));
        assert!(matches!(check_argv(&argv(&["x", ""])), Err(ArgvProblem::Element(1, _))));
        assert!(matches!(check_argv(&argv(&["x", "a\0"])), Err(ArgvProblem::Element(1, m)) if m.contains("NUL")));
        assert!(matches!(check_argv(&argv(&["../bin/x"])), Err(ArgvProblem::Element(0, _))));
        assert!(matches!(check_argv(&argv(&["bin//x"])), Err(ArgvProblem::Element(0, _))));
        assert!(matches!(check_argv(&argv(&["/usr/../bin/sh"])), Err(ArgvProblem::Element(0, _))));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("0s").unwrap_err().contains("greater than zero"));
        assert!(parse_duration("61m").unwrap_err().contains("at most 1h"));
        assert!(parse_duration("ten").unwrap_err().contains("invalid duration"));
    }

    #[test]
    fn memory() {
        assert_eq!(parse_memory("512M"), Ok(512 * 1024 * 1024));
        assert_eq!(parse_memory("2G"), Ok(2 * 1024 * 1024 * 1024));
        assert_eq!(parse_memory("8192K"), Ok(8192 * 1024));
        assert_eq!(parse_memory("1T"), Ok(1 << 40));
        assert_eq!(parse_memory("4194304"), Ok(4 * 1024 * 1024));
        assert!(parse_memory("1024K").unwrap_err().contains("at least 4M"));
        assert!(parse_memory("4194303").unwrap_err().contains("at least 4M"));
        assert!(parse_memory("12X").unwrap_err().contains("suffix"));
        assert!(parse_memory("M").is_err());
        assert!(parse_memory("1.5G").is_err());
        assert!(parse_memory("99999999999999999999T").unwrap_err().contains("too large"));
    }
}
