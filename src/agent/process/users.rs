//! The user an instance's processes run as, looked up in the node's user
//! database (`getpwnam_r` through nix).

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

/// Looks up `name`; an unknown user is [`ProcessError::UnknownUser`].
pub fn resolve(name: &str) -> Result<RunAs, ProcessError> {
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
    }
}
