//! Installing an instance on this node: the checks made before any byte
//! of the package is accepted (run-as user, reachability of the instance
//! directory, generation), the package cache, and the completion that moves
//! the extracted tree into place and records the instance.

use std::path::PathBuf;

use super::*;

impl Node {
    pub(super) fn resolve_run_as(&self, wanted: Option<&str>) -> Result<users::RunAs, AgentResponse> {
        if !nix::unistd::geteuid().is_root() {
            // Not root: everything runs as the agent's own user.
            return Ok(users::current());
        }
        let name = wanted.or(self.policy.default_run_as.as_deref()).unwrap_or("nobody");
        if name == "root" && !self.policy.allow_root {
            return Err(failure(
                FailureKind::BadRequest,
                "run_as = \"root\" is refused by this agent (allow_root = false)",
            ));
        }
        users::resolve(name).map_err(|e| failure(FailureKind::BadRequest, format!("run_as {name:?}: {e}")))
    }

    /// Checks that a run-as user other than the agent's can reach the
    /// instance root (every ancestor must be searchable by others).
    pub(super) fn check_reachable(&self, run_as: &users::RunAs) -> Result<(), AgentResponse> {
        use std::os::unix::fs::PermissionsExt;
        if run_as.uid == nix::unistd::geteuid().as_raw() || run_as.uid == 0 {
            return Ok(());
        }
        let mut p = Some(self.root.as_path());
        while let Some(dir) = p {
            if let Ok(meta) = std::fs::metadata(dir)
                && meta.permissions().mode() & 0o001 == 0
            {
                return Err(failure(
                    FailureKind::BadRequest,
                    format!(
                        "user {} cannot reach {} ({} is not searchable by others); put the agent's data_dir elsewhere or set default_run_as",
                        run_as.name,
                        self.root.display(),
                        dir.display()
                    ),
                ));
            }
            p = dir.parent();
        }
        Ok(())
    }

    /// The cached copy of a package, if this node holds it.
    pub fn cached_package(&self, sha256: &str) -> Option<PathBuf> {
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
            return None;
        }
        let p = self.package_cache.join(format!("{sha256}.tar.gz"));
        p.is_file().then_some(p)
    }

    /// Checks an install header before any byte is written, without
    /// waiting: it runs on the connection's read loop, and awaiting the
    /// instance's lock there (held for as long as a health-gated start or
    /// a hook takes) would stop the agent reading its socket until the
    /// master's write deadline closes the link, failing every command in
    /// flight on the node. So the record is looked at only if its lock is
    /// free now; when it is busy, the checks that need it (generation,
    /// running) are left to [`Self::complete_install`], which takes the
    /// lock anyway and makes them all again.
    pub fn check_install(&self, begin: &InstallBegin) -> Result<users::RunAs, AgentResponse> {
        if !begin.instance.is_safe_path_component() {
            return Err(failure(
                FailureKind::BadRequest,
                format!("instance id {:?} is not a safe name", begin.instance),
            ));
        }
        let slot = self.slot(&begin.instance);
        if let Ok(guard) = slot.record.try_lock()
            && let Some(r) = guard.as_ref()
        {
            self.refuse_install(begin, r)?;
        }
        let run_as = self.resolve_run_as(begin.run_as.as_deref())?;
        self.check_reachable(&run_as)?;
        Ok(run_as)
    }

    /// Why `begin` may not replace the installed `rec`: an older
    /// generation, or a process still running in the directory.
    pub(super) fn refuse_install(&self, begin: &InstallBegin, rec: &AgentInstanceRecord) -> Result<(), AgentResponse> {
        if begin.generation < rec.generation {
            return Err(stale(&begin.instance, begin.generation, rec.generation));
        }
        if rec.pid.as_ref().is_some_and(|p| self.processes.is_alive(p)) {
            return Err(failure(
                FailureKind::BadRequest,
                format!("instance {} is running; stop it before installing", begin.instance),
            ));
        }
        Ok(())
    }

    /// Second half of an install: the package is extracted in `staging`.
    /// Moves it into place, writes the rendered files, hands ownership to
    /// the run-as user, and records the instance.
    pub async fn complete_install(&self, begin: InstallBegin, staging: PathBuf, run_as: users::RunAs) -> AgentResponse {
        let slot = self.slot(&begin.instance);
        let mut guard = slot.lock("install").await;
        // Every check of `check_install` that needs the record, again: it
        // may have skipped them (the lock was busy), and a command that
        // held the lock meanwhile may have moved the generation or started
        // the process.
        if let Some(r) = guard.as_ref()
            && let Err(refused) = self.refuse_install(&begin, r)
        {
            let _ = tokio::fs::remove_dir_all(&staging).await;
            return refused;
        }
        let dir = self.instance_dir(&begin.instance);
        let files = begin.files.clone();
        let owner = (run_as.uid, run_as.gid);
        let placed = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || -> Result<u32, String> {
                installer::place_instance_dir(&staging, &dir).map_err(|e| crate::error::ErrorChain(&e).to_string())?;
                write_rendered_files(&dir, &files, None).map_err(|e| crate::error::ErrorChain(&e).to_string())?;
                if nix::unistd::geteuid().is_root() {
                    installer::chown_tree_nofollow(&dir, owner.0, owner.1)
                        .map_err(|e| crate::error::ErrorChain(&e).to_string())?;
                }
                Ok(files.len() as u32)
            }
        })
        .await;
        let files_written = match placed {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return failure(FailureKind::Install, format!("install of {}: {e}", begin.instance)),
            Err(e) => return failure(FailureKind::Internal, format!("install task failed: {e}")),
        };
        let rec = AgentInstanceRecord {
            version: RECORD_VERSION,
            id: begin.instance.clone(),
            generation: begin.generation,
            desired_running: false,
            run_as: run_as.name.clone(),
            process: begin.process.clone(),
            package_sha256: begin.package_sha256.clone(),
            file_hashes: hashes(&begin.files),
            pid: None,
        };
        if let Err(e) = self.persist(&rec).await {
            return failure(FailureKind::Internal, e);
        }
        *guard = Some(rec);
        AgentResponse::InstallResult { files_written }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::testkit::{TestNode, spec};

    fn begin(id: &InstanceId, generation: u64) -> InstallBegin {
        InstallBegin {
            instance: id.clone(),
            generation,
            run_as: None,
            process: spec(&["sleep", "100"]),
            files: vec![],
            package_sha256: "00".repeat(32),
            package_size: 0,
        }
    }

    /// A staging dir as an extraction leaves it.
    fn staging(t: &TestNode, name: &str) -> PathBuf {
        let dir = t.node.root.join(format!(".staging-{name}"));
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::write(dir.join("bin/x"), "x").unwrap();
        dir
    }

    /// `check_install` runs on the read loop: with the instance's lock held
    /// (a long start or hook) it answers at once and leaves the record's
    /// checks to `complete_install`, which makes them once it has the lock.
    #[tokio::test]
    async fn install_checks_skipped_under_a_busy_lock_are_made_at_completion() {
        let t = TestNode::new();
        let me = users::current().name;
        let id = t.install("busy", &me, spec(&["sleep", "100"]), &[]).await;
        assert!(matches!(t.node.start(&id, 2).await, AgentResponse::Started { .. }));
        let running = |r: &AgentResponse| matches!(r, AgentResponse::Failed(f) if f.message.contains("is running"));

        // Lock free: refused at once, stale or running.
        let r = t.node.check_install(&begin(&id, 3)).map(|_| ()).unwrap_err();
        assert!(running(&r), "{r:?}");
        let r = t.node.check_install(&begin(&id, 1)).map(|_| ()).unwrap_err();
        assert!(matches!(&r, AgentResponse::Failed(f) if f.kind == FailureKind::StaleGeneration), "{r:?}");

        // Lock held: no wait (the call is not async), no refusal yet.
        let slot = t.node.slot(&id);
        let held = slot.lock("install cleanup").await;
        let run_as = t.node.check_install(&begin(&id, 3)).expect("deferred while the lock is busy");
        assert!(t.node.check_install(&begin(&id, 1)).is_ok());
        drop(held);

        // Completion refuses both, and removes what was extracted.
        let dir = staging(&t, "running");
        let r = t.node.complete_install(begin(&id, 3), dir.clone(), run_as.clone()).await;
        assert!(running(&r), "an install over a running process: {r:?}");
        assert!(!dir.exists());
        let dir = staging(&t, "stale");
        let r = t.node.complete_install(begin(&id, 1), dir.clone(), run_as.clone()).await;
        assert!(matches!(&r, AgentResponse::Failed(f) if f.kind == FailureKind::StaleGeneration), "{r:?}");
        assert!(!dir.exists());
        assert_eq!(t.record(&id).await.generation, 2);

        // Stopped: the install goes through.
        assert!(matches!(t.node.stop(&id, 4).await, AgentResponse::Stopped { was_running: true }));
        let r = t.node.complete_install(begin(&id, 5), staging(&t, "ok"), run_as).await;
        assert_eq!(r, AgentResponse::InstallResult { files_written: 0 });
        assert!(t.node.instance_dir(&id).join("bin/x").exists());
    }
}
