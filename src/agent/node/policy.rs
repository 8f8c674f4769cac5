//! What this agent lets a package ask for, decided by the agent's own
//! config and never by the master: which users an instance may run as
//! (root judged by uid and gid, not by name) and whether its environment
//! may steer the dynamic loader.

use super::users::RunAs;
use crate::config::AgentConfig;

/// How the agent treats the run-as users and environments of specs.
#[derive(Debug, Clone, Default)]
pub struct RunAsPolicy {
    /// The user of instances whose spec names none; `None`: each cluster
    /// its own dynamic user (`dynamic_users`), or `nobody` without them.
    pub default_run_as: Option<String>,
    /// The uids dynamic users are taken from; `None`: none are given.
    pub dynamic_users: Option<(u32, u32)>,
    /// Whether an instance may run as uid 0 or gid 0, whatever its name.
    pub allow_root: bool,
    /// The users a spec may name; empty: any (root only with `allow_root`).
    /// The agent's default user is always allowed.
    pub allowed_run_as: Vec<String>,
    /// Whether a spec's `env` may set loader variables ([`is_loader_var`]).
    pub allow_loader_env: bool,
}

/// Environment variables through which the dynamic loader (or glibc's
/// iconv, `GCONV_PATH`) loads code or changes how it runs: every `LD_*`
/// name, and `GLIBC_TUNABLES` (parsed by the loader itself before `main`;
/// CVE-2023-4911 turned it into code execution).
///
/// Variables through which one *program* loads code (`BASH_ENV`,
/// `PYTHONPATH`, `PERL5LIB`, `NODE_OPTIONS`, ...) are not refused: they
/// change only what the instance's own processes run, as the instance's
/// own user, which its package's start script could do anyway. The loader
/// variables are refused because they reach every binary the instance
/// starts, setuid ones included (where the loader's secure mode is the
/// only guard).
pub fn is_loader_var(name: &str) -> bool {
    name.starts_with("LD_") || name == "GCONV_PATH" || name == "GLIBC_TUNABLES"
}

impl RunAsPolicy {
    pub fn from_config(cfg: &AgentConfig) -> RunAsPolicy {
        RunAsPolicy {
            default_run_as: cfg.default_run_as.clone(),
            // Checked when the settings are loaded (`validate`).
            dynamic_users: cfg.dynamic_uids().ok().flatten(),
            allow_root: cfg.allow_root,
            allowed_run_as: cfg.allowed_run_as.clone(),
            allow_loader_env: cfg.allow_loader_env,
        }
    }

    /// The user an instance runs as when its spec names none (root agent).
    pub fn default_user(&self) -> &str {
        self.default_run_as.as_deref().unwrap_or("nobody")
    }

    /// Why `user` (resolved from the spec's `run_as`, or the default) may
    /// not run an instance here, if it may not: uid 0 or gid 0 without
    /// `allow_root` (an alias of root such as `toor` is still root), or a
    /// name outside `allowed_run_as`.
    pub fn refuse_user(&self, user: &RunAs) -> Option<String> {
        if (user.uid == 0 || user.gid == 0) && !self.allow_root {
            return Some(format!(
                "run_as {:?} is uid {} gid {}: running as root (uid 0 or gid 0) is refused by this agent (allow_root = false)",
                user.name, user.uid, user.gid
            ));
        }
        // A dynamic user is given by this agent, never named by a spec:
        // `allowed_run_as` limits the names specs may give.
        if !self.allowed_run_as.is_empty()
            && !crate::agent::process::users::is_dynamic(&user.name)
            && user.name != self.default_user()
            && !self.allowed_run_as.contains(&user.name)
        {
            return Some(format!(
                "run_as {:?} is not in this agent's allowed_run_as ({}) nor its default user {:?}",
                user.name,
                self.allowed_run_as.join(", "),
                self.default_user()
            ));
        }
        None
    }

    /// Why `env` may not be given to an instance's processes, if it may
    /// not: a loader variable without `allow_loader_env`.
    pub fn refuse_env(&self, env: &[(String, String)]) -> Option<String> {
        if self.allow_loader_env {
            return None;
        }
        let bad: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).filter(|k| is_loader_var(k)).collect();
        (!bad.is_empty()).then(|| {
            format!(
                "env sets {}: dynamic-loader variables (LD_*, GCONV_PATH, GLIBC_TUNABLES) are refused by this agent (allow_loader_env = false)",
                bad.join(", ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, uid: u32, gid: u32) -> RunAs {
        RunAs { name: name.into(), uid, gid }
    }

    #[test]
    fn root_is_judged_by_uid_and_gid_not_by_name() {
        let strict = RunAsPolicy::default();
        for u in [user("root", 0, 0), user("toor", 0, 1000), user("app", 1000, 0)] {
            let why = strict.refuse_user(&u).unwrap_or_else(|| panic!("{u:?} passed"));
            assert!(why.contains(&u.name) && why.contains("allow_root = false"), "{why}");
        }
        assert_eq!(strict.refuse_user(&user("app", 1000, 1000)), None);
        let root_ok = RunAsPolicy { allow_root: true, ..RunAsPolicy::default() };
        assert_eq!(root_ok.refuse_user(&user("toor", 0, 0)), None);
    }

    #[test]
    fn allowed_run_as_limits_the_named_users_but_not_the_default() {
        let p = RunAsPolicy { allowed_run_as: vec!["app".into()], ..RunAsPolicy::default() };
        assert_eq!(p.refuse_user(&user("app", 1000, 1000)), None);
        assert_eq!(p.refuse_user(&user("nobody", 65534, 65534)), None, "the default user");
        let why = p.refuse_user(&user("daemon", 1, 1)).unwrap();
        assert!(why.contains("\"daemon\"") && why.contains("allowed_run_as (app)"), "{why}");
        // The list does not let root in.
        let p = RunAsPolicy { allowed_run_as: vec!["root".into()], ..RunAsPolicy::default() };
        assert!(p.refuse_user(&user("root", 0, 0)).unwrap().contains("allow_root"));
    }

    #[test]
    fn loader_variables_are_refused_unless_allowed() {
        let env = |names: &[&str]| names.iter().map(|n| (n.to_string(), "x".to_string())).collect::<Vec<_>>();
        let p = RunAsPolicy::default();
        assert_eq!(p.refuse_env(&env(&["PATH", "JAVA_OPTS", "XLD_PRELOAD", "ld_preload"])), None);
        for bad in ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "LD_BIND_NOW", "GCONV_PATH", "GLIBC_TUNABLES"] {
            let why = p.refuse_env(&env(&["PATH", bad])).unwrap_or_else(|| panic!("{bad} passed"));
            assert!(why.contains(bad) && why.contains("allow_loader_env = false"), "{why}");
        }
        let open = RunAsPolicy { allow_loader_env: true, ..RunAsPolicy::default() };
        assert_eq!(open.refuse_env(&env(&["LD_PRELOAD"])), None);
    }
}
