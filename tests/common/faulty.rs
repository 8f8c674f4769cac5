//! Failures injected at a chosen step of a real operation (issue 9).
//!
//! [`package`] builds a component whose every script (start, the stop
//! command, and each hook a spec supports: init, scale_out, scale_in,
//! reload, destroy) first runs `bin/gate.sh WHAT`, which obeys switches
//! the test sets as files in a control directory ([`Ctl`]) it owns; the
//! cluster's config value `ctl` names that directory (each cluster its
//! own), and each instance's `TAG` is `<role>-<ordinal>`:
//!
//! - `hold-WHAT` or `hold-WHAT-TAG`: the script waits while the file
//!   exists, after creating `at-WHAT-TAG` (the test's sign that it got
//!   there). A test catches an operation inside a step this way, then
//!   injects its fault (kills the agent or the master, fills the disk).
//! - `fail-WHAT[-TAG][@VERSION]`: the script exits 1 ("injected failure").
//! - `failonce-WHAT[-TAG][@VERSION]`: the same, once (the script removes
//!   the file), so an undo that runs the same script again succeeds.
//!
//! Each run appends `WHAT TAG VERSION` to `ran`, so a test counts how
//! often each script ran. The start script then records its version in
//! `data/version` and its pid in `data/up`, and becomes `sleep`; the
//! health check passes once that pid is the `sleep`, so a start held in
//! its gate keeps its step running.
//!
//! [`Tmpfs`] puts the master's data directory on a small tmpfs, so a test
//! can fill it: RocksDB's writes then fail for real (`ENOSPC`).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use super::env::TestEnv;
use super::http::all_instances;
pub use super::package::PackageBuilder;
use super::procfs::instance_pids;

/// The component's name.
pub const NAME: &str = "fy";

// `umask 0`: the instances of one cluster on different nodes may run
// as different dynamic users, and all of them append to the same files.
const GATE: &str = r#"set -u
umask 0
w=$1
v=@VERSION@
echo "$w $TAG $v" >> "$CTL/ran"
: > "$CTL/at-$w-$TAG"
while [ -e "$CTL/hold-$w" ] || [ -e "$CTL/hold-$w-$TAG" ]; do sleep 0.02; done
for f in "$w" "$w-$TAG" "$w@$v" "$w-$TAG@$v"; do
  if [ -e "$CTL/fail-$f" ] || rm "$CTL/failonce-$f" 2>/dev/null; then
    echo "injected failure: $w of $TAG ($v)" >&2
    exit 1
  fi
done
exit 0
"#;

const START: &str = r#"set -u
bin/gate.sh start || exit 1
echo @VERSION@ > data/version
echo $$ > data/up
exec sleep 100000
"#;

const HEALTH: &str = r#"p=$(cat data/up 2>/dev/null) || exit 1
case "$(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null)" in sleep*) exit 0 ;; esac
exit 1
"#;

/// What both roles run.
const ROLE: &str = r#"start = ["bin/start.sh"]
stop = ["bin/gate.sh", "stop"]
stop_grace = "10s"
start_timeout = "30s"
health = { cmd = ["bin/health.sh"] }
init = ["bin/gate.sh", "init"]
scale_out = ["bin/gate.sh", "scale_out"]
scale_in = ["bin/gate.sh", "scale_in"]
reload = ["bin/gate.sh", "reload"]
destroy = ["bin/gate.sh", "destroy"]
hook_timeout = "30s"
env = { CTL = "{{ cluster.config.ctl }}", TAG = "{{ instance.role }}-{{ instance.ordinal }}" }

[[roles.files]]
path = "conf/members"
template = "{% for m in cluster.roles.a.members %}{{ m.ordinal }} {% endfor %}tick={{ cluster.config.tick }}\n"
change_mode = "reload"
"#;

/// The package at `version`: role `a` (order 0, 1 to 6 instances) and
/// role `b` (order 1, 1 to 3), both gated (see the module doc).
pub fn package(version: &str) -> PackageBuilder {
    let spec = format!(
        "[component]\nname = \"{NAME}\"\nversion = \"{version}\"\n\n[config]\n\
         ctl = {{ type = \"string\", default = \"/nonexistent\" }}\n\
         tick = {{ type = \"int\", default = 1 }}\n\n\
         [[roles]]\nname = \"a\"\ncount = {{ min = 1, max = 6 }}\n{ROLE}\n\
         [[roles]]\nname = \"b\"\norder = 1\ncount = {{ min = 1, max = 3 }}\n{ROLE}"
    );
    PackageBuilder::new(NAME, version)
        .spec(&spec)
        .script("bin/gate.sh", &GATE.replace("@VERSION@", version))
        .script("bin/start.sh", &START.replace("@VERSION@", version))
        .script("bin/health.sh", HEALTH)
}

/// The body of a create: `a` on node-1 and node-2, `b` on node-3.
pub fn create_body(name: &str, version: &str, ctl: &Ctl) -> Value {
    json!({"name": name, "package": {"name": NAME, "version": version},
        "config": {"ctl": ctl.dir.display().to_string()},
        "roles": {"a": {"count": 2, "nodes": ["node-1", "node-2"]}, "b": {"count": 1, "nodes": ["node-3"]}}})
}

/// Where the control directories of one test live (removed with it).
pub struct CtlRoot(tempfile::TempDir);

impl CtlRoot {
    pub fn new() -> CtlRoot {
        let dir = tempfile::Builder::new().prefix("flotilla-ctl-").tempdir().expect("control root");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod control root");
        CtlRoot(dir)
    }

    /// A fresh control directory for one cluster (writable by `nobody`).
    pub fn cluster(&self, name: &str) -> Ctl {
        let dir = self.0.path().join(name);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod control dir");
        Ctl { dir }
    }
}

impl Default for CtlRoot {
    fn default() -> Self {
        CtlRoot::new()
    }
}

/// One cluster's switches (see the module doc).
pub struct Ctl {
    pub dir: PathBuf,
}

impl Ctl {
    /// Sets the switch `name` (e.g. `hold-start-a-2`, `fail-init`).
    pub fn set(&self, name: &str) {
        std::fs::write(self.dir.join(name), b"").unwrap_or_else(|e| panic!("setting {name}: {e}"));
    }

    pub fn clear(&self, name: &str) {
        match std::fs::remove_file(self.dir.join(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("clearing {name}: {e}"),
        }
    }

    /// Holds the next run of `what` of `tag` in its gate (forgetting that
    /// an earlier run got there).
    pub fn hold(&self, what: &str, tag: &str) {
        self.clear(&format!("at-{what}-{tag}"));
        self.set(&format!("hold-{what}-{tag}"));
    }

    /// Lets a held `what` of `tag` go on.
    pub fn release(&self, what: &str, tag: &str) {
        self.clear(&format!("hold-{what}-{tag}"));
    }

    /// Whether `what` of `tag` got to its gate since [`Ctl::hold`].
    pub fn reached(&self, what: &str, tag: &str) -> bool {
        self.dir.join(format!("at-{what}-{tag}")).exists()
    }

    /// Every script run: (what, tag, version), in order.
    pub fn ran(&self) -> Vec<(String, String, String)> {
        let text = std::fs::read_to_string(self.dir.join("ran")).unwrap_or_default();
        text.lines()
            .map(|l| {
                let mut p = l.split(' ').map(str::to_string);
                (p.next().unwrap_or_default(), p.next().unwrap_or_default(), p.next().unwrap_or_default())
            })
            .collect()
    }

    /// How many times `what` ran for `tag`.
    pub fn runs(&self, what: &str, tag: &str) -> usize {
        self.ran().iter().filter(|(w, t, _)| w == what && t == tag).count()
    }

    /// How many times `what` ran, by tag.
    pub fn runs_by_tag(&self, what: &str) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for (w, t, _) in self.ran() {
            if w == what {
                *out.entry(t).or_default() += 1;
            }
        }
        out
    }
}

/// One instance as a user sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Inst {
    pub id: String,
    pub node: String,
    pub status: String,
    pub pid: Option<u32>,
    pub dir: PathBuf,
    pub last_error: String,
}

/// A cluster as a user checks it: its status and every instance by tag.
#[derive(Debug, Clone)]
pub struct Seen {
    pub status: String,
    pub description: String,
    pub version: String,
    pub busy: bool,
    pub instances: BTreeMap<String, Inst>,
}

impl Seen {
    pub fn from(cluster: &Value) -> Seen {
        let instances = all_instances(cluster)
            .iter()
            .map(|i| {
                let tag = format!("{}-{}", i["role"].as_str().unwrap_or("?"), i["ordinal"]);
                let inst = Inst {
                    id: i["id"].as_str().unwrap_or_default().to_string(),
                    node: i["node"].as_str().unwrap_or_default().to_string(),
                    status: i["status"].as_str().unwrap_or_default().to_string(),
                    pid: i["pid"].as_u64().map(|p| p as u32),
                    dir: PathBuf::from(i["dir"].as_str().unwrap_or_default()),
                    last_error: i["last_error"].as_str().unwrap_or_default().to_string(),
                };
                (tag, inst)
            })
            .collect();
        Seen {
            status: cluster["status"].as_str().unwrap_or_default().to_string(),
            description: cluster["status_description"].as_str().unwrap_or_default().to_string(),
            version: cluster["package"]["version"].as_str().unwrap_or_default().to_string(),
            busy: !cluster["operation"].is_null(),
            instances,
        }
    }

    pub fn tag(&self, tag: &str) -> &Inst {
        self.instances.get(tag).unwrap_or_else(|| panic!("no instance {tag}: {self:#?}"))
    }

    /// The agent index (1..=3) of `tag`'s node.
    pub fn agent_of(&self, tag: &str) -> usize {
        let node = &self.tag(tag).node;
        node.strip_prefix("node-").and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("node {node}"))
    }

    /// What runs matches what the master says: a `Running` instance has
    /// exactly its one process (the pid it shows), any other none.
    pub fn processes_match(&self) -> Result<(), String> {
        let mut wrong = Vec::new();
        for (tag, i) in &self.instances {
            let pids = instance_pids(&i.id);
            let ok = match (i.status.as_str(), i.pid) {
                ("Running", Some(pid)) => pids == [pid],
                _ => pids.is_empty(),
            };
            if !ok {
                wrong.push(format!("{tag} is {} with pid {:?}, yet runs {pids:?}", i.status, i.pid));
            }
        }
        if wrong.is_empty() { Ok(()) } else { Err(wrong.join("; ")) }
    }
}

/// The cluster `name` as [`Seen`].
pub async fn seen(env: &TestEnv, name: &str) -> Seen {
    Seen::from(&env.cluster(name).await)
}

/// Waits until `name` is not busy and its processes match what the master
/// says (an agent's inventory, an exit, may take a moment to arrive).
pub async fn settled(env: &TestEnv, name: &str, secs: u64) -> Seen {
    env.until(secs, &format!("cluster {name} settles"), async || {
        let s = seen(env, name).await;
        match s.processes_match() {
            Ok(()) if !s.busy => Ok(s),
            Ok(()) => Err(format!("busy: {s:#?}")),
            Err(e) => Err(format!("{e}: {s:#?}")),
        }
    })
    .await
}

/// `GET /operations/{id}` (its `operation`).
pub async fn operation(env: &TestEnv, id: &str) -> Value {
    let (status, body) = env.get(&format!("/operations/{id}")).await;
    assert_eq!(status, 200, "GET /operations/{id}: {body:#}");
    body["operation"].clone()
}

/// The step names of `op`, in order.
pub fn step_names(op: &Value) -> Vec<String> {
    op["steps"].as_array().expect("steps").iter().map(|s| s["name"].as_str().unwrap_or("?").to_string()).collect()
}

/// The status of step `step` of `op`.
pub fn step_status(op: &Value, step: &str) -> String {
    let s = op["steps"].as_array().expect("steps").iter().find(|s| s["name"] == step);
    s.unwrap_or_else(|| panic!("no step {step}: {op:#}"))["status"].as_str().unwrap_or_default().to_string()
}

/// Waits until the operation's step `step` is `Running` and the script
/// `what` of `tag` is held in its gate.
pub async fn wait_held(env: &TestEnv, ctl: &Ctl, op: &str, step: &str, what: &str, tag: &str) {
    env.until(30, &format!("step {step} runs and {what} of {tag} is held"), async || {
        let o = operation(env, op).await;
        let status = step_status(&o, step);
        if status == "Running" && ctl.reached(what, tag) { Ok(()) } else { Err(format!("{status}: {o:#}")) }
    })
    .await
}

/// Instance directories on the agents, by instance id.
pub fn dirs_on_agents(env: &TestEnv) -> Vec<String> {
    env.agent_instance_dirs()
        .iter()
        .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_string))
        .filter(|n| !n.starts_with('.'))
        .collect()
}

/// The master's data directory on a tmpfs of `mib` MiB, mounted by the
/// test (it runs as root): [`Tmpfs::fill`] leaves it no free byte, so
/// RocksDB's writes fail for real, and [`Tmpfs::free`] gives the space
/// back. Drop it after the env: it unmounts (lazily, should the master
/// still hold files) and removes the env's temp dir, which the env could
/// not remove with the mount point in it.
pub struct Tmpfs {
    pub path: PathBuf,
    filler: PathBuf,
}

impl Tmpfs {
    /// Moves the (stopped) master's data directory onto a new tmpfs.
    pub fn mount_over(path: &Path, mib: u32) -> Tmpfs {
        let saved = path.with_extension("saved");
        std::fs::rename(path, &saved).expect("move the master's data dir aside");
        std::fs::create_dir(path).expect("mount point");
        run("mount", &["-t", "tmpfs", "-o", &format!("size={mib}m,mode=0755"), "tmpfs", &path.display().to_string()]);
        let t = Tmpfs { path: path.to_path_buf(), filler: path.join("filler") };
        run("cp", &["-a", &format!("{}/.", saved.display()), &path.display().to_string()]);
        std::fs::remove_dir_all(&saved).expect("remove the copy");
        t
    }

    /// Fills the tmpfs to its last byte.
    pub fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&self.filler).expect("filler");
        let block = vec![0u8; 64 * 1024];
        loop {
            if f.write_all(&block).is_err() {
                break;
            }
        }
        // Whatever is left is smaller than a block: take it too.
        while f.write_all(&[0u8]).is_ok() {}
    }

    pub fn free(&self) {
        let _ = std::fs::remove_file(&self.filler);
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        if let Some(root) = self.path.parent()
            && root.file_name().is_some_and(|n| n.to_string_lossy().starts_with("flotilla-"))
            && std::env::var_os("FLOTILLA_TEST_KEEP").is_none()
        {
            let _ = std::fs::remove_dir_all(root);
        }
    }
}

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// What an install under way leaves on agent `i`: its staging directory
/// (`instances/.staging-*`) and the package as it arrives
/// (`packages/.incoming-*`).
pub fn install_leftovers(env: &TestEnv, i: usize) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for (dir, prefix) in [("instances", ".staging-"), ("packages", ".incoming-")] {
        if let Ok(rd) = std::fs::read_dir(env.agent_dir(i).join(dir)) {
            out.extend(rd.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(prefix)).map(|e| e.path()));
        }
    }
    out.sort();
    out
}

/// The package at `version` with `mib` MiB of random bytes in it, so that
/// its install streams long enough for a test to act in the middle.
pub fn big_package(version: &str, mib: usize) -> PackageBuilder {
    use std::io::Read;
    let mut blob = Vec::new();
    std::fs::File::open("/dev/urandom")
        .expect("urandom")
        .take((mib << 20) as u64)
        .read_to_end(&mut blob)
        .expect("random");
    package(version).file("lib/blob.bin", 0o644, blob)
}
