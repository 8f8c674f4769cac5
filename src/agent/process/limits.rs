//! Resource limits (memory, CPU) of instances, through whichever cgroup
//! hierarchy offers each controller on this machine.
//!
//! Why not simply the instance's cgroup v2 ([`super::cgroup`]): on a hybrid
//! host (these machines) the unified hierarchy at `/sys/fs/cgroup/unified`
//! holds no `memory` or `cpu` controller at all; those are cgroup **v1**
//! hierarchies of their own (`/sys/fs/cgroup/memory`, `/sys/fs/cgroup/cpu`).
//! A controller is bound to exactly one of the two, so each one is looked up
//! on its own: in the v2 root's `cgroup.controllers` first, else among the
//! v1 mounts of `/proc/self/mountinfo` (never assumed at a fixed path).
//!
//! Per instance there is one directory `<mount>/flotilla/<node scope>/<instance>`
//! in each hierarchy that holds one of the controllers (on a pure v2 host that
//! is the instance's own cgroup). [`LimitRoot::prepare`] creates them and
//! writes the limits; the spawn hook then moves the child into each of them
//! before `exec` (writing "0" to `cgroup.procs` works in v1 too), so every
//! descendant is born limited. [`LimitRoot::remove`] deletes them after the
//! processes are gone (a cgroup can only be removed empty).
//!
//! Limits are never silently dropped: an agent that cannot enforce them says
//! so in its `Hello` (`resource_limits: false`) and a start that asks for
//! them fails ([`LimitsError::Unavailable`]).

use std::io;
use std::path::{Path, PathBuf};

use nix::unistd::geteuid;

use super::cgroup::{self, cgroup2_mount, is_safe_component, unescape_mountinfo};
use crate::ids::InstanceId;
use crate::protocol::messages::ResourceLimits;

/// The CFS period every instance gets; the quota is `cpu * period`.
pub const CPU_PERIOD_US: u64 = 100_000;
/// The smallest CFS quota the kernel accepts (1 ms).
const MIN_CPU_QUOTA_US: u64 = 1_000;

/// Why limits cannot be applied.
#[derive(Debug, thiserror::Error)]
pub enum LimitsError {
    /// This agent has no writable memory and cpu controllers.
    #[error("this agent cannot enforce resource limits ({reason})")]
    Unavailable { reason: String },
    /// The requested values make no sense (zero memory, negative CPU, ...).
    #[error("invalid resource limits: {reason}")]
    Invalid { reason: String },
    /// Creating a cgroup or writing a limit failed; `what` says which.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> LimitsError {
    let what = what.into();
    move |source| LimitsError::Io { what, source }
}

/// The cgroup version a controller is found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// Where one controller lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    pub version: Version,
    pub mount: PathBuf,
}

impl Hierarchy {
    fn top(&self) -> PathBuf {
        self.mount.join("flotilla")
    }
}

/// The validated values to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Values {
    pub memory_bytes: Option<u64>,
    pub cpu_quota_us: Option<u64>,
}

impl Values {
    /// Checks `limits`; `None` when they limit nothing (both fields unset).
    pub fn from_limits(limits: &ResourceLimits) -> Result<Option<Values>, LimitsError> {
        if limits.memory_bytes.is_none() && limits.cpu.is_none() {
            return Ok(None);
        }
        let invalid = |reason: String| LimitsError::Invalid { reason };
        if limits.memory_bytes == Some(0) {
            return Err(invalid("memory limit of 0 bytes".into()));
        }
        let cpu_quota_us = match limits.cpu {
            None => None,
            Some(cpu) if !cpu.is_finite() || cpu <= 0.0 || cpu > 100_000.0 => {
                return Err(invalid(format!("cpu = {cpu} is not a number of CPUs in (0, 100000]")));
            }
            Some(cpu) => {
                // In range by the check above, so the cast neither wraps nor saturates.
                let quota = (cpu * CPU_PERIOD_US as f64).round() as u64;
                if quota < MIN_CPU_QUOTA_US {
                    return Err(invalid(format!(
                        "cpu = {cpu} is below the smallest quota the kernel accepts ({} CPUs)",
                        MIN_CPU_QUOTA_US as f64 / CPU_PERIOD_US as f64
                    )));
                }
                Some(quota)
            }
        };
        Ok(Some(Values { memory_bytes: limits.memory_bytes, cpu_quota_us }))
    }
}

/// The agent's limit cgroups: one subtree per hierarchy holding `memory` or
/// `cpu`, both under `flotilla/<node scope>`.
#[derive(Debug, Clone)]
pub struct LimitRoot {
    memory: Hierarchy,
    cpu: Hierarchy,
    scope: String,
}

impl LimitRoot {
    /// Finds the memory and cpu controllers and checks the agent can create
    /// cgroups in their hierarchies (root only). The error says why not; the
    /// node scope's own directories are created lazily by [`Self::prepare`],
    /// so an agent (or a test) that never limits anything leaves nothing
    /// behind but the shared `flotilla` directory.
    pub fn detect(node_scope: &str) -> Result<LimitRoot, String> {
        if !geteuid().is_root() {
            return Err("the agent is not root".into());
        }
        if !is_safe_component(node_scope) {
            return Err(format!("node scope {node_scope:?} is not a safe cgroup name"));
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
        let (memory, cpu) = locate(&mountinfo, |p| std::fs::read_to_string(p.join("cgroup.controllers")).ok())?;
        let root = LimitRoot { memory, cpu, scope: node_scope.to_string() };
        for (h, controllers) in root.hierarchies() {
            let top = h.top();
            std::fs::create_dir_all(&top).map_err(|e| format!("cannot create {}: {e}", top.display()))?;
            if h.version == Version::V2 {
                enable(&h.mount, &controllers).map_err(|e| crate::error::ErrorChain(&e).to_string())?;
                enable(&top, &controllers).map_err(|e| crate::error::ErrorChain(&e).to_string())?;
            }
        }
        Ok(root)
    }

    /// Where the memory controller lives.
    pub fn memory(&self) -> &Hierarchy {
        &self.memory
    }

    /// Where the cpu controller lives.
    pub fn cpu(&self) -> &Hierarchy {
        &self.cpu
    }

    /// `<mount>/flotilla/<node scope>` of each distinct hierarchy.
    pub fn bases(&self) -> Vec<PathBuf> {
        self.hierarchies().into_iter().map(|(h, _)| h.top().join(&self.scope)).collect()
    }

    /// The distinct hierarchies, each with the controllers it holds.
    fn hierarchies(&self) -> Vec<(&Hierarchy, Vec<&'static str>)> {
        if self.memory == self.cpu {
            vec![(&self.memory, vec!["memory", "cpu"])]
        } else {
            vec![(&self.memory, vec!["memory"]), (&self.cpu, vec!["cpu"])]
        }
    }

    /// The instance's limit cgroup in each hierarchy (existing or not).
    pub fn dirs_of(&self, instance: &InstanceId) -> Result<Vec<PathBuf>, LimitsError> {
        if !instance.is_safe_path_component() {
            return Err(LimitsError::Invalid { reason: format!("instance id {instance:?} is not a safe cgroup name") });
        }
        Ok(self.bases().into_iter().map(|b| b.join(instance.as_str())).collect())
    }

    /// Creates the instance's limit cgroups (fine when they exist, e.g. left
    /// by a crash: every value is written again) and writes `values`; a
    /// field left unset is written as "unlimited". Returns the directories
    /// the process must be moved into.
    pub fn prepare(&self, instance: &InstanceId, values: &Values) -> Result<Vec<PathBuf>, LimitsError> {
        let dirs = self.dirs_of(instance)?;
        for ((h, controllers), dir) in self.hierarchies().into_iter().zip(&dirs) {
            let base = dir.parent().unwrap_or(dir);
            std::fs::create_dir_all(base).map_err(io_err(format!("creating {}", base.display())))?;
            if h.version == Version::V2 {
                // Children of the scope only get the controllers it enables.
                enable(base, &controllers)?;
            }
            super::cgroup::create_under(base, dir).map_err(io_err(format!("creating {}", dir.display())))?;
            for c in controllers {
                for (file, value) in settings(c, h.version, values) {
                    let path = dir.join(file);
                    std::fs::write(&path, &value).map_err(io_err(format!("writing {value} to {}", path.display())))?;
                }
            }
        }
        Ok(dirs)
    }

    /// Removes the instance's limit cgroups once its processes are gone
    /// (missing ones are fine). Tries every one; returns the first error.
    pub async fn remove(&self, instance: &InstanceId) -> Result<(), LimitsError> {
        let mut first = None;
        for dir in self.dirs_of(instance)? {
            if let Err(e) = cgroup::remove(&dir).await {
                first.get_or_insert(io_err(format!("removing {}", dir.display()))(e));
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// The files and values that set `controller` in a cgroup of `version`.
fn settings(controller: &str, version: Version, v: &Values) -> Vec<(&'static str, String)> {
    let or = |x: Option<u64>, unlimited: &str| x.map_or_else(|| unlimited.to_string(), |n| n.to_string());
    match (controller, version) {
        ("memory", Version::V2) => vec![("memory.max", or(v.memory_bytes, "max"))],
        ("memory", Version::V1) => vec![("memory.limit_in_bytes", or(v.memory_bytes, "-1"))],
        ("cpu", Version::V2) => vec![("cpu.max", format!("{} {CPU_PERIOD_US}", or(v.cpu_quota_us, "max")))],
        // Period first: the quota is checked against it.
        ("cpu", Version::V1) => {
            vec![("cpu.cfs_period_us", CPU_PERIOD_US.to_string()), ("cpu.cfs_quota_us", or(v.cpu_quota_us, "-1"))]
        }
        _ => Vec::new(),
    }
}

/// Enables `controllers` for the children of the v2 cgroup `dir` (those
/// already enabled are left alone).
fn enable(dir: &Path, controllers: &[&str]) -> Result<(), LimitsError> {
    let path = dir.join("cgroup.subtree_control");
    let current = std::fs::read_to_string(&path).map_err(io_err(format!("reading {}", path.display())))?;
    for c in controllers {
        if current.split_whitespace().any(|x| x == *c) {
            continue;
        }
        std::fs::write(&path, format!("+{c}")).map_err(io_err(format!("enabling {c} in {}", path.display())))?;
    }
    Ok(())
}

/// Finds the hierarchy of the memory and of the cpu controller: v2 when the
/// v2 root lists it in `cgroup.controllers` (`read_controllers` reads that
/// file of a mount), else the v1 mount whose options name it.
pub fn locate(
    mountinfo: &str,
    read_controllers: impl Fn(&Path) -> Option<String>,
) -> Result<(Hierarchy, Hierarchy), String> {
    let v2 = cgroup2_mount(mountinfo);
    let v2_controllers = v2.as_deref().and_then(&read_controllers).unwrap_or_default();
    let find = |controller: &str| -> Result<Hierarchy, String> {
        if let Some(mount) = &v2
            && v2_controllers.split_whitespace().any(|c| c == controller)
        {
            return Ok(Hierarchy { version: Version::V2, mount: mount.clone() });
        }
        v1_mount(mountinfo, controller)
            .map(|mount| Hierarchy { version: Version::V1, mount })
            .ok_or_else(|| format!("no cgroup hierarchy offers the {controller} controller"))
    };
    Ok((find("memory")?, find("cpu")?))
}

/// The mount point of the v1 hierarchy that holds `controller` (named
/// exactly in its super options: `cpu` is not `cpuset` nor `cpuacct`).
fn v1_mount(mountinfo: &str, controller: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // id parent maj:min root mountpoint options [optional...] - fstype source superopts
        let (left, right) = line.split_once(" - ")?;
        let mut right = right.split_whitespace();
        if right.next()? != "cgroup" {
            return None;
        }
        let superopts = right.nth(1)?;
        if !superopts.split(',').any(|o| o == controller) {
            return None;
        }
        let mount_point = left.split_whitespace().nth(4)?;
        Some(PathBuf::from(unescape_mountinfo(mount_point)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
        32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
        33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n\
        34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n\
        35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
        41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

    fn v1(mount: &str) -> Hierarchy {
        Hierarchy { version: Version::V1, mount: PathBuf::from(mount) }
    }

    #[test]
    fn locates_v1_controllers_on_a_hybrid_host() {
        let (mem, cpu) = locate(HYBRID, |_| Some("hugetlb\n".into())).unwrap();
        assert_eq!(mem, v1("/sys/fs/cgroup/memory"));
        assert_eq!(cpu, v1("/sys/fs/cgroup/cpu"));
        // cpu co-mounted with cpuacct; `cpuset` alone must not match `cpu`.
        let text = "1 0 0:1 / /cg/cpuset rw - cgroup cgroup rw,cpuset\n\
                    2 0 0:2 / /cg/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
                    3 0 0:3 / /cg/memory rw - cgroup cgroup rw,memory\n";
        let (mem, cpu) = locate(text, |_| None).unwrap();
        assert_eq!((mem, cpu), (v1("/cg/memory"), v1("/cg/cpu,cpuacct")));
    }

    #[test]
    fn prefers_v2_when_the_unified_root_has_the_controller() {
        let pure = "25 1 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let (mem, cpu) = locate(pure, |p| {
            assert_eq!(p, Path::new("/sys/fs/cgroup"));
            Some("cpuset cpu io memory pids\n".into())
        })
        .unwrap();
        let v2 = Hierarchy { version: Version::V2, mount: PathBuf::from("/sys/fs/cgroup") };
        assert_eq!((mem, cpu), (v2.clone(), v2));
        // Memory on v2, cpu still bound to v1.
        let (mem, cpu) = locate(HYBRID, |_| Some("memory hugetlb".into())).unwrap();
        assert_eq!(mem.version, Version::V2);
        assert_eq!(cpu, v1("/sys/fs/cgroup/cpu"));
    }

    #[test]
    fn says_which_controller_is_missing() {
        let no_cpu = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert_eq!(locate(no_cpu, |_| None).unwrap_err(), "no cgroup hierarchy offers the cpu controller");
        let nothing = "25 1 0:23 / /x rw - tmpfs tmpfs rw\n";
        assert_eq!(locate(nothing, |_| None).unwrap_err(), "no cgroup hierarchy offers the memory controller");
    }

    #[test]
    fn validates_and_converts_values() {
        let lim = |memory_bytes, cpu| ResourceLimits { memory_bytes, cpu };
        assert_eq!(Values::from_limits(&lim(None, None)).unwrap(), None);
        assert_eq!(
            Values::from_limits(&lim(Some(64 << 20), Some(0.5))).unwrap(),
            Some(Values { memory_bytes: Some(67_108_864), cpu_quota_us: Some(50_000) })
        );
        assert_eq!(
            Values::from_limits(&lim(None, Some(2.0))).unwrap(),
            Some(Values { memory_bytes: None, cpu_quota_us: Some(200_000) })
        );
        for bad in [lim(Some(0), None), lim(None, Some(0.0)), lim(None, Some(-1.0)), lim(None, Some(f64::NAN))] {
            assert!(matches!(Values::from_limits(&bad), Err(LimitsError::Invalid { .. })), "{bad:?}");
        }
        let tiny = Values::from_limits(&lim(None, Some(0.001))).unwrap_err();
        assert!(tiny.to_string().contains("smallest quota"), "{tiny}");
    }

    #[test]
    fn writes_the_right_files_per_version() {
        let v = Values { memory_bytes: Some(1 << 20), cpu_quota_us: None };
        assert_eq!(settings("memory", Version::V1, &v), vec![("memory.limit_in_bytes", "1048576".to_string())]);
        assert_eq!(settings("memory", Version::V2, &v), vec![("memory.max", "1048576".to_string())]);
        assert_eq!(
            settings("cpu", Version::V1, &v),
            vec![("cpu.cfs_period_us", "100000".to_string()), ("cpu.cfs_quota_us", "-1".to_string())]
        );
        assert_eq!(settings("cpu", Version::V2, &v), vec![("cpu.max", "max 100000".to_string())]);
    }

    #[test]
    fn detect_refuses_unsafe_scopes_and_is_available_to_root_here() {
        assert!(LimitRoot::detect("../etc").is_err());
        // The tests run as root on machines with memory and cpu controllers
        // (v1 on the hybrid hosts): detection must find them.
        assert!(geteuid().is_root(), "this test needs root (run it as root, as .ci/run does)");
        let root = LimitRoot::detect("unit-limits").unwrap();
        assert!(root.memory().mount.join("flotilla").is_dir());
        assert!(root.cpu().mount.join("flotilla").is_dir());
        // Lazily created: detection leaves no scope directory behind.
        assert!(root.bases().iter().all(|b| !b.exists()));
    }
}
