//! One cgroup v2 per instance, under `<cgroup2 mount>/flotilla/<node scope>/`.
//!
//! The cgroup2 mount is found in `/proc/self/mountinfo` (on hybrid hosts it
//! is e.g. `/sys/fs/cgroup/unified`, never assumed). Every process of an
//! instance is born inside its cgroup (the spawn hook moves the child before
//! `exec`), so the whole tree, daemons included, is found in `cgroup.procs`
//! and killed at once with `cgroup.kill`.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::{AccessFlags, Pid, access};

use crate::ids::InstanceId;

/// The agent's cgroup subtree for one node scope.
#[derive(Debug, Clone)]
pub struct CgroupRoot {
    mount: PathBuf,
    base: PathBuf,
}

impl CgroupRoot {
    /// Finds the cgroup2 mount, creates `<mount>/flotilla/<node_scope>` and
    /// checks that the agent may create cgroups there and move processes in.
    /// `None` when any of that is impossible (the caller then falls back to
    /// process groups).
    pub fn detect(node_scope: &str) -> Option<CgroupRoot> {
        if !is_safe_component(node_scope) {
            return None;
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let mount = cgroup2_mount(&mountinfo)?;
        let base = mount.join("flotilla").join(node_scope);
        std::fs::create_dir_all(&base).ok()?;
        if access(&base.join("cgroup.procs"), AccessFlags::W_OK).is_err() {
            return None;
        }
        // Moving a process needs write access to cgroup.procs of the common
        // ancestor of its current cgroup and the target.
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let own = own.lines().find_map(|l| l.strip_prefix("0::"))?;
        let own_path = mount.join(own.trim_start_matches('/'));
        let ancestor = common_ancestor(&own_path, &base);
        if !ancestor.starts_with(&mount) || access(&ancestor.join("cgroup.procs"), AccessFlags::W_OK).is_err() {
            return None;
        }
        Some(CgroupRoot { mount, base })
    }

    /// The cgroup2 mount point.
    pub fn mount(&self) -> &Path {
        &self.mount
    }

    /// `<mount>/flotilla/<node scope>`.
    pub fn base(&self) -> &Path {
        &self.base
    }

    /// The cgroup directory of `instance` (whether it exists or not).
    pub fn path_of(&self, instance: &InstanceId) -> io::Result<PathBuf> {
        if !instance.is_safe_path_component() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("instance id {instance:?} is not a safe cgroup name"),
            ));
        }
        Ok(self.base.join(instance.as_str()))
    }

    /// Creates the instance's cgroup (fine when it exists) and returns it.
    pub fn create(&self, instance: &InstanceId) -> io::Result<PathBuf> {
        let path = self.path_of(instance)?;
        create_under(&self.base, &path)?;
        Ok(path)
    }
}

/// Creates cgroup `dir` (fine when it exists) below `base`, creating `base`
/// too: an agent that exits removes its empty base directory, and another
/// agent with the same node scope (a second dev run, parallel tests) may
/// have just done so. A base removed between the two mkdirs is made again.
pub fn create_under(base: &Path, dir: &Path) -> io::Result<()> {
    let mut attempts = 0;
    loop {
        std::fs::create_dir_all(base)?;
        match std::fs::create_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound && attempts < 3 => attempts += 1,
            Err(e) => return Err(e),
        }
    }
}

/// The pids in the cgroup at `path` (empty when it does not exist).
pub fn procs(path: &Path) -> Vec<u32> {
    match std::fs::read_to_string(path.join("cgroup.procs")) {
        Ok(text) => text.lines().filter_map(|l| l.trim().parse().ok()).collect(),
        Err(_) => Vec::new(),
    }
}

/// True when no process is left in the cgroup (or it does not exist).
pub fn is_empty(path: &Path) -> bool {
    match std::fs::read_to_string(path.join("cgroup.events")) {
        Ok(text) => !text.lines().any(|l| l.trim() == "populated 1"),
        Err(_) => procs(path).is_empty(),
    }
}

/// SIGKILLs every process of the cgroup: `cgroup.kill` where the kernel has
/// it (atomic, also catches processes forking meanwhile), else each pid.
pub fn kill_all(path: &Path) -> io::Result<()> {
    if !path.exists() {
        return Ok(());
    }
    match std::fs::write(path.join("cgroup.kill"), b"1") {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            for pid in procs(path) {
                if let Ok(p) = i32::try_from(pid) {
                    // ESRCH (gone meanwhile) is fine.
                    let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
                }
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Removes the (empty) cgroup, retrying for up to ~2 s while the kernel
/// finishes tearing down exited tasks (`EBUSY`). A missing cgroup is fine.
pub async fn remove(path: &Path) -> io::Result<()> {
    let mut delay = Duration::from_millis(5);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        match std::fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
            Err(_) => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(100));
            }
        }
    }
}

/// The mount point of the first `cgroup2` filesystem in a mountinfo text.
pub(super) fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // id parent maj:min root mountpoint options [optional...] - fstype source superopts
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mount_point = left.split_whitespace().nth(4)?;
        Some(PathBuf::from(unescape_mountinfo(mount_point)))
    })
}

/// Decodes the octal escapes (`\040` for a space, ...) of mountinfo paths.
pub(super) fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b)) {
            let v = (bytes[i + 1] - b'0') as u32 * 64 + (bytes[i + 2] - b'0') as u32 * 8 + (bytes[i + 3] - b'0') as u32;
            if let Ok(b) = u8::try_from(v) {
                out.push(b);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn common_ancestor(a: &Path, b: &Path) -> PathBuf {
    a.components().zip(b.components()).take_while(|(x, y)| x == y).map(|(x, _)| x).collect()
}

pub(super) fn is_safe_component(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('\0') && s.len() <= 200
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount_in_mountinfo() {
        let text = "25 1 0:23 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
                    41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw\n\
                    42 31 0:39 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        assert_eq!(cgroup2_mount(text), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(cgroup2_mount("1 0 0:1 / /a\\040b rw - cgroup2 none rw\n"), Some(PathBuf::from("/a b")));
        assert_eq!(cgroup2_mount("25 1 0:23 / /x rw - tmpfs tmpfs rw\n"), None);
    }

    #[test]
    fn common_ancestor_of_paths() {
        assert_eq!(
            common_ancestor(Path::new("/sys/fs/cgroup/unified"), Path::new("/sys/fs/cgroup/unified/flotilla/n1")),
            PathBuf::from("/sys/fs/cgroup/unified")
        );
        assert_eq!(common_ancestor(Path::new("/a/b/c"), Path::new("/a/x")), PathBuf::from("/a"));
    }

    #[test]
    fn refuses_unsafe_node_scopes() {
        assert!(CgroupRoot::detect("../etc").is_none());
        assert!(CgroupRoot::detect("").is_none());
    }

    #[tokio::test]
    async fn create_list_kill_remove_on_this_machine() {
        // This machine has a writable cgroup2 (the agent runs as root); where
        // it has none, detect() must say so instead of failing later.
        let scope = format!("unit-cg-{}", std::process::id());
        assert!(nix::unistd::geteuid().is_root(), "this test needs root (run it as root, as .ci/run does)");
        assert!(
            cgroup2_mount(&std::fs::read_to_string("/proc/self/mountinfo").unwrap()).is_some(),
            "this test needs a cgroup2 mount"
        );
        let root = CgroupRoot::detect(&scope).expect("root with a cgroup2 mount must get a cgroup root");
        let id = InstanceId::new("cg-unit-1");
        let path = root.create(&id).unwrap();
        assert!(path.starts_with(root.mount()));
        assert!(is_empty(&path));
        let mut child = tokio::process::Command::new("sleep")
            .arg("1000")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = child.id().unwrap();
        std::fs::write(path.join("cgroup.procs"), pid.to_string()).unwrap();
        assert_eq!(procs(&path), vec![pid]);
        assert!(!is_empty(&path));
        kill_all(&path).unwrap();
        let status = child.wait().await.unwrap();
        assert!(!status.success());
        remove(&path).await.unwrap();
        assert!(!path.exists());
        std::fs::remove_dir(root.base()).unwrap();
    }
}
