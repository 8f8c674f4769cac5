//! The fake process layer of a simulated agent: what it holds (instances,
//! packages) and how each request changes it. Pure and synchronous, so the
//! rules the real agent follows (generations, idempotence, what a reply
//! says) are easy to see and to test; the session (`agent.rs`) adds the
//! latencies and the wire.

use std::collections::{BTreeMap, HashMap, HashSet};

use sha2::{Digest, Sha256};

use crate::agent::node::{failure, not_installed, stale};
use crate::ids::InstanceId;
use crate::protocol::messages::{AgentResponse, ENV_CHANGED, FailureKind, InstallBegin, InstanceReport, RenderedFile};

/// One simulated instance.
#[derive(Debug, Clone)]
pub struct SimInstance {
    pub generation: u64,
    pub desired_running: bool,
    /// A fake pid while "running".
    pub pid: Option<u32>,
    /// Path -> the last written file: sha256 of its contents and its mode
    /// (the 0o777 bits the real agent applies); either changing is a change.
    pub files: BTreeMap<String, ([u8; 32], u32)>,
    pub env: Vec<(String, String)>,
    /// How many times a process of it was started (not counting a start
    /// that found it running): a test checks nothing started twice.
    pub starts: u32,
}

/// Everything one simulated agent holds.
#[derive(Debug, Default)]
pub struct SimState {
    pub instances: HashMap<InstanceId, SimInstance>,
    /// Packages received (by sha256): later installs skip the bytes.
    pub packages: HashSet<String>,
    next_pid: u32,
    /// The answer to each instance's last command that changed it, by
    /// generation: a command sent again is answered it again, as the real
    /// agent does (`agent::node::Node::replay`).
    answered: HashMap<InstanceId, (u64, &'static str, AgentResponse)>,
}

/// What the real agent compares to decide whether a file changed.
fn written(f: &RenderedFile) -> ([u8; 32], u32) {
    (Sha256::digest(&f.contents).into(), f.mode & 0o777)
}

impl SimState {
    /// `work`, unless it is the command (`kind`) at `generation` answered
    /// already.
    pub fn once(
        &mut self,
        id: &InstanceId,
        generation: u64,
        kind: &'static str,
        work: impl FnOnce(&mut SimState) -> AgentResponse,
    ) -> AgentResponse {
        if let Some((g, k, answer)) = self.answered.get(id)
            && *g == generation
            && *k == kind
        {
            return answer.clone();
        }
        let answer = work(self);
        // Not the answer to an older command (refused as stale).
        if self.answered.get(id).is_none_or(|(g, _, _)| *g <= generation) {
            self.answered.insert(id.clone(), (generation, kind, answer.clone()));
        }
        answer
    }

    fn pid(&mut self) -> u32 {
        self.next_pid = self.next_pid.wrapping_add(1).max(100);
        self.next_pid
    }

    /// Whether an install may begin (generation, not running), and whether
    /// the bytes are needed.
    pub fn install_begin(&self, b: &InstallBegin) -> Result<bool, AgentResponse> {
        if !b.instance.is_safe_path_component() {
            return Err(failure(FailureKind::BadRequest, format!("instance id {:?} is not a safe name", b.instance)));
        }
        self.refuse_install(b)?;
        Ok(!self.packages.contains(&b.package_sha256))
    }

    /// Why `b` may not replace what is installed: an older generation, or
    /// a process still running.
    fn refuse_install(&self, b: &InstallBegin) -> Result<(), AgentResponse> {
        if let Some(i) = self.instances.get(&b.instance) {
            if b.generation < i.generation {
                return Err(stale(&b.instance, b.generation, i.generation));
            }
            if i.pid.is_some() {
                return Err(failure(
                    FailureKind::BadRequest,
                    format!("instance {} is running; stop it before installing", b.instance),
                ));
            }
        }
        Ok(())
    }

    /// The package is in place: record the instance (installed, stopped).
    /// Checked again, as the real agent does: a start may have come in
    /// between.
    pub fn install_complete(&mut self, b: &InstallBegin) -> AgentResponse {
        if let Err(refused) = self.refuse_install(b) {
            return refused;
        }
        self.packages.insert(b.package_sha256.clone());
        let files = b.files.iter().map(|f| (f.path.clone(), written(f))).collect();
        self.instances.insert(
            b.instance.clone(),
            SimInstance {
                generation: b.generation,
                desired_running: false,
                pid: None,
                files,
                env: b.process.env.clone(),
                starts: 0,
            },
        );
        AgentResponse::InstallResult { files_written: b.files.len() as u32 }
    }

    pub fn write_files(
        &mut self,
        id: &InstanceId,
        generation: u64,
        files: &[RenderedFile],
        env: Option<Vec<(String, String)>>,
    ) -> AgentResponse {
        let Some(i) = self.instances.get_mut(id) else { return not_installed(id) };
        if generation < i.generation {
            return stale(id, generation, i.generation);
        }
        i.generation = generation;
        let mut changed = Vec::new();
        for f in files {
            let d = written(f);
            if i.files.get(&f.path) != Some(&d) {
                changed.push(f.path.clone());
                i.files.insert(f.path.clone(), d);
            }
        }
        if let Some(env) = env
            && env != i.env
        {
            i.env = env;
            changed.push(ENV_CHANGED.to_string());
        }
        AgentResponse::FilesWritten { changed }
    }

    pub fn start(&mut self, id: &InstanceId, generation: u64) -> AgentResponse {
        let pid = self.pid();
        let Some(i) = self.instances.get_mut(id) else { return not_installed(id) };
        if generation < i.generation {
            return stale(id, generation, i.generation);
        }
        i.generation = generation;
        i.desired_running = true;
        match i.pid {
            Some(p) => AgentResponse::Started { pid: p, already_running: true },
            None => {
                i.pid = Some(pid);
                i.starts += 1;
                AgentResponse::Started { pid, already_running: false }
            }
        }
    }

    pub fn stop(&mut self, id: &InstanceId, generation: u64) -> AgentResponse {
        // As the real agent: nothing of an instance not held runs.
        let Some(i) = self.instances.get_mut(id) else { return AgentResponse::Stopped { was_running: false } };
        if generation < i.generation {
            return stale(id, generation, i.generation);
        }
        i.generation = generation;
        i.desired_running = false;
        AgentResponse::Stopped { was_running: i.pid.take().is_some() }
    }

    pub fn delete(&mut self, id: &InstanceId, generation: u64) -> AgentResponse {
        if let Some(i) = self.instances.get(id)
            && generation < i.generation
        {
            return stale(id, generation, i.generation);
        }
        AgentResponse::Deleted { existed: self.instances.remove(id).is_some() }
    }

    /// Hooks and health checks: an installed instance passes.
    pub fn check(&mut self, id: &InstanceId, generation: Option<u64>, hook: bool) -> AgentResponse {
        let Some(i) = self.instances.get_mut(id) else { return not_installed(id) };
        if let Some(g) = generation {
            if g < i.generation {
                return stale(id, g, i.generation);
            }
            i.generation = g;
        }
        if hook {
            AgentResponse::HookDone { exit_code: 0, stdout_tail: String::new(), stderr_tail: String::new() }
        } else if i.pid.is_some() {
            AgentResponse::Healthy
        } else {
            failure(FailureKind::Health, format!("instance {id} is not running"))
        }
    }

    pub fn signal(&mut self, id: &InstanceId, generation: u64) -> AgentResponse {
        let Some(i) = self.instances.get_mut(id) else { return not_installed(id) };
        if generation < i.generation {
            return stale(id, generation, i.generation);
        }
        i.generation = generation;
        AgentResponse::Signalled { delivered: i.pid.is_some() }
    }

    /// A crash: the process is gone; the instance stays wanted running.
    /// Returns the pid that "exited".
    pub fn crash(&mut self, id: &InstanceId) -> Option<u32> {
        self.instances.get_mut(id).and_then(|i| i.pid.take())
    }

    pub fn inventory(&self) -> Vec<InstanceReport> {
        self.instances
            .iter()
            .map(|(id, i)| InstanceReport {
                instance: id.clone(),
                generation: i.generation,
                desired_running: i.desired_running,
                running: i.pid.is_some(),
                pid: i.pid,
            })
            .collect()
    }

    pub fn running(&self) -> usize {
        self.instances.values().filter(|i| i.pid.is_some()).count()
    }
}
