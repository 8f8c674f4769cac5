//! The user an instance's processes run as, looked up in the node's user
//! database (`getpwnam_r` through nix), or one of the agent's dynamic users
//! (`node::dynamic_users`), written `dynamic:<uid>`: a `:` is never part of
//! a user name (it separates the fields of `/etc/passwd`), so no real user
//! is taken for one, and a spec naming one is refused ([`is_dynamic`]).

use nix::unistd::{Gid, Uid, User, getegid, geteuid};

use super::ProcessError;

/// A resolved run-as user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub name: String,
    pub uid: u32,
    /// The user's primary group; the only group its processes get.
    pub gid: u32,
}

impl RunAs {
    /// True when spawning as this user means switching uid/gid: the agent
    /// is root and the user is someone else.
    pub(crate) fn needs_switch(&self) -> bool {
        geteuid().is_root() && (self.uid != geteuid().as_raw() || self.gid != getegid().as_raw())
    }
}

/// How a dynamic user's name starts.
pub const DYNAMIC_PREFIX: &str = "dynamic:";

/// The dynamic user of `uid` (its group is the same number).
pub fn dynamic(uid: u32) -> RunAs {
    RunAs { name: format!("{DYNAMIC_PREFIX}{uid}"), uid, gid: uid }
}

/// True when `name` is in the dynamic users' form (never a real user).
pub fn is_dynamic(name: &str) -> bool {
    name.contains(':')
}

/// Looks up `name`; an unknown user is [`ProcessError::UnknownUser`].
pub fn resolve(name: &str) -> Result<RunAs, ProcessError> {
    if let Some(uid) = name.strip_prefix(DYNAMIC_PREFIX) {
        return match uid.parse::<u32>() {
            Ok(uid) if uid != 0 => Ok(dynamic(uid)),
            _ => Err(ProcessError::UnknownUser { name: name.to_string() }),
        };
    }
    if is_dynamic(name) {
        return Err(ProcessError::UnknownUser { name: name.to_string() });
    }
    match User::from_name(name) {
        Ok(Some(u)) => Ok(RunAs { name: u.name, uid: u.uid.as_raw(), gid: u.gid.as_raw() }),
        Ok(None) => Err(ProcessError::UnknownUser { name: name.to_string() }),
        Err(errno) => Err(ProcessError::Io { what: format!("looking up user {name:?}"), source: errno.into() }),
    }
}

/// The agent's own (effective) user.
pub fn current() -> RunAs {
    let uid: Uid = geteuid();
    let gid: Gid = getegid();
    let name = match User::from_uid(uid) {
        Ok(Some(u)) => u.name,
        _ => uid.as_raw().to_string(),
    };
    RunAs { name, uid: uid.as_raw(), gid: gid.as_raw() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_known_users_and_refuses_unknown_ones() {
        let root = resolve("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert!(matches!(
            resolve("no-such-user-flotilla"),
            Err(ProcessError::UnknownUser { name }) if name == "no-such-user-flotilla"
        ));
        let me = current();
        assert_eq!(me.uid, geteuid().as_raw());
        assert!(!me.needs_switch());
        assert_eq!(resolve("dynamic:61184").unwrap(), RunAs { name: "dynamic:61184".into(), uid: 61184, gid: 61184 });
        for bad in ["dynamic:0", "dynamic:x", "dynamic:", "other:1", "root:"] {
            assert!(matches!(resolve(bad), Err(ProcessError::UnknownUser { .. })), "{bad}");
        }
    }
}
