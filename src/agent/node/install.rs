//! Installing an instance on this node: the checks made before any byte
//! of the package is accepted (run-as user, reachability of the instance
//! directory, generation), the package cache, and the completion that moves
//! the extracted tree into place and records the instance.

use std::path::{Path, PathBuf};

use super::*;

/// Who an install's instance runs as: a user of the node, resolved when
/// the install is checked, or its cluster's dynamic user, given (and
/// recorded) when the install completes (the check may not wait).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallUser {
    Named(users::RunAs),
    Dynamic,
}

impl Node {
    pub(super) fn resolve_run_as(&self, wanted: Option<&str>) -> Result<InstallUser, AgentResponse> {
        if !nix::unistd::geteuid().is_root() {
            // Not root: everything runs as the agent's own user.
            return Ok(InstallUser::Named(users::current()));
        }
        if let Some(name) = wanted
            && users::is_dynamic(name)
        {
            return Err(failure(
                FailureKind::BadRequest,
                format!("run_as {name:?} is not a user name (a dynamic user is never named by a spec)"),
            ));
        }
        let name = match (wanted, self.policy.default_run_as.as_deref()) {
            (Some(name), _) | (None, Some(name)) => name,
            (None, None) if self.users.enabled() => return Ok(InstallUser::Dynamic),
            (None, None) => self.policy.default_user(),
        };
        let user =
            users::resolve(name).map_err(|e| failure(FailureKind::BadRequest, format!("run_as {name:?}: {e}")))?;
        // By uid and gid, not by name: an alias of root is root.
        match self.policy.refuse_user(&user) {
            Some(why) => Err(failure(FailureKind::BadRequest, why)),
            None => Ok(InstallUser::Named(user)),
        }
    }

    /// Checks that a run-as user other than the agent's can reach the
    /// instance root (every ancestor must be searchable by others).
    pub(super) fn check_reachable(&self, user: &InstallUser) -> Result<(), AgentResponse> {
        use std::os::unix::fs::PermissionsExt;
        let name = match user {
            InstallUser::Named(u) if u.uid == nix::unistd::geteuid().as_raw() || u.uid == 0 => return Ok(()),
            InstallUser::Named(u) => u.name.as_str(),
            InstallUser::Dynamic => "the cluster's dynamic user",
        };
        let mut p = Some(self.root.as_path());
        while let Some(dir) = p {
            if let Ok(meta) = std::fs::metadata(dir)
                && meta.permissions().mode() & 0o001 == 0
            {
                return Err(failure(
                    FailureKind::BadRequest,
                    format!(
                        "{name} cannot reach {} ({} is not searchable by others); put the agent's data_dir elsewhere or set default_run_as",
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
    pub fn check_install(&self, begin: &InstallBegin) -> Result<InstallUser, AgentResponse> {
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
        if let Some(why) = self.policy.refuse_env(&begin.process.env) {
            return Err(failure(FailureKind::BadRequest, format!("instance {}: {why}", begin.instance)));
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

    /// Ends whatever still runs of an instance this node holds no record
    /// of but has a directory for (its agent lost its store): installed
    /// again, it would run twice. Every process carrying its marker gets
    /// TERM, then KILL.
    async fn end_leftovers(&self, id: &InstanceId, dir: &Path) -> Result<(), AgentResponse> {
        let spec = crate::protocol::messages::ProcessSpec {
            start: vec![],
            stop: None,
            pidfile: None,
            stop_grace_ms: 2000,
            start_timeout_ms: 1000,
            env: vec![],
            health: None,
            limits: None,
        };
        let me = users::current();
        let req = StopRequest { instance: id, dir, spec: &spec, run_as: &me, current: None };
        let stopped = self.processes.stop(&req).await;
        self.processes.forget_confirmation(id);
        match stopped {
            Ok(true) => {
                tracing::warn!(instance = %id, "ended processes of an instance installed again without its record (the agent lost its store)");
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(e) => Err(failure(
                FailureKind::Install,
                format!(
                    "instance {id}: what still runs of it from before cannot be ended: {}",
                    crate::error::ErrorChain(&e)
                ),
            )),
        }
    }

    /// Second half of an install: the package is extracted in `staging`.
    /// Moves it into place, writes the rendered files, hands ownership to
    /// the run-as user, and records the instance.
    pub async fn complete_install(&self, begin: InstallBegin, staging: PathBuf, user: InstallUser) -> AgentResponse {
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
        if guard.is_none()
            && dir.exists()
            && let Err(refused) = self.end_leftovers(&begin.instance, &dir).await
        {
            let _ = tokio::fs::remove_dir_all(&staging).await;
            return refused;
        }
        let run_as = match user {
            InstallUser::Named(u) => u,
            InstallUser::Dynamic => {
                match self.users.join(&self.store, &begin.cluster.to_string(), &begin.instance).await {
                    Ok(u) => u,
                    Err(e) => {
                        let _ = tokio::fs::remove_dir_all(&staging).await;
                        return failure(FailureKind::Install, format!("install of {}: {e}", begin.instance));
                    }
                }
            }
        };
        let files = begin.files.clone();
        let owner = (run_as.uid, run_as.gid);
        let placed = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || -> Result<u32, String> {
                give_tree(&staging, &dir, &files, owner).map_err(|e| crate::error::ErrorChain(&e).to_string())?;
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

/// Places the extracted package in `staging` at `dir` and gives it to
/// `owner` (as root): the package's files while only root reaches the
/// staging dir; then what an upgrade carried over in `data/ logs/ run/`,
/// only what the previous user owned, and only when the user changed;
/// then the rendered files, written as `owner`'s.
fn give_tree(
    staging: &std::path::Path,
    dir: &std::path::Path,
    files: &[crate::protocol::messages::RenderedFile],
    owner: (u32, u32),
) -> Result<(), crate::agent::installer::InstallError> {
    use crate::agent::beneath::tree::chown_tree;
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        installer::place_instance_dir(staging, dir, None)?;
        return write_rendered_files(dir, files, None).map(drop);
    }
    let previous = std::fs::symlink_metadata(dir).ok().filter(|m| m.is_dir()).map(|m| m.uid());
    chown_tree(staging, owner.0, owner.1, None)?;
    installer::place_instance_dir(staging, dir, Some(owner))?;
    // Never from root: what root owns in a carried dir (a hard link to a
    // file of root's) is not the previous user's to pass on.
    if let Some(prev) = previous.filter(|p| *p != owner.0 && *p != 0) {
        for d in crate::package::RESERVED_DIRS {
            chown_tree(&dir.join(d), owner.0, owner.1, Some(prev))?;
        }
    }
    write_rendered_files(dir, files, Some(owner)).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::testkit::{TestNode, spec};

    fn refused(r: AgentResponse, kind: FailureKind, says: &[&str]) {
        match &r {
            AgentResponse::Failed(f) if f.kind == kind && says.iter().all(|s| f.message.contains(s)) => {}
            other => panic!("expected a {kind:?} failure saying {says:?}, got {other:?}"),
        }
    }

    /// The agent's config, not the master, decides (issue 9): a spec's
    /// loader variables are refused at install, when files change the
    /// env, and at start and for hooks of a record that predates the rule.
    #[tokio::test]
    async fn loader_variables_in_the_env_are_refused_unless_the_agent_allows_them() {
        let t = TestNode::with_policy(RunAsPolicy::default());
        let id = InstanceId::new("loader-env");
        let mut b = begin(&id, 1);
        b.process.env.push(("LD_PRELOAD".into(), "/tmp/evil.so".into()));
        refused(
            t.node.check_install(&b).map(|_| ()).unwrap_err(),
            FailureKind::BadRequest,
            &["LD_PRELOAD", "allow_loader_env = false"],
        );

        let me = users::current().name;
        let mut with_gconv = spec(&["sleep", "100"]);
        with_gconv.env.push(("GCONV_PATH".into(), "/tmp".into()));
        let old = t.install("old-record", &me, with_gconv, &[]).await;
        refused(t.node.start(&old, 2).await, FailureKind::Start, &["GCONV_PATH"]);
        assert_eq!(t.record(&old).await.pid, None, "nothing started");

        let ok = t.install("ok", &me, spec(&["sleep", "100"]), &[]).await;
        let env = vec![("LD_LIBRARY_PATH".to_string(), "/tmp".to_string())];
        refused(
            t.node.write_files(&ok, 2, vec![], Some(env.clone())).await,
            FailureKind::BadRequest,
            &["LD_LIBRARY_PATH"],
        );
        assert!(!t.record(&ok).await.process.env.iter().any(|(k, _)| k == "LD_LIBRARY_PATH"));

        // Allowed by the agent's config: installed and started.
        let open =
            TestNode::with_policy(RunAsPolicy { allow_loader_env: true, allow_root: true, ..RunAsPolicy::default() });
        assert!(open.node.check_install(&b).is_ok());
        let mut ld = spec(&["sleep", "100"]);
        ld.env = env;
        let id = open.install("ld-ok", &me, ld, &[]).await;
        assert!(matches!(open.node.start(&id, 2).await, AgentResponse::Started { .. }));
        assert!(matches!(open.node.stop(&id, 3).await, AgentResponse::Stopped { was_running: true }));
    }

    /// Root is refused by uid and gid, at install and again at start; and
    /// `allowed_run_as` limits the users a spec may name.
    #[tokio::test]
    async fn root_and_users_outside_allowed_run_as_are_refused() {
        // A non-root agent runs everything as itself: nothing to refuse.
        assert!(nix::unistd::geteuid().is_root(), "run-as users need a root agent (CI runs the tests as root)");
        let t = TestNode::with_policy(RunAsPolicy {
            allowed_run_as: vec!["daemon".into(), "root".into()],
            ..RunAsPolicy::default()
        });
        let id = InstanceId::new("who");
        let named = |user: Option<&str>| InstallBegin { run_as: user.map(str::to_string), ..begin(&id, 1) };
        refused(
            t.node.check_install(&named(Some("root"))).map(|_| ()).unwrap_err(),
            FailureKind::BadRequest,
            &["\"root\" is uid 0 gid 0", "allow_root = false"],
        );
        refused(
            t.node.check_install(&named(Some("bin"))).map(|_| ()).unwrap_err(),
            FailureKind::BadRequest,
            &["\"bin\"", "allowed_run_as (daemon, root)"],
        );
        let name = |u: InstallUser| match u {
            InstallUser::Named(u) => u.name,
            InstallUser::Dynamic => "dynamic".into(),
        };
        assert_eq!(name(t.node.check_install(&named(Some("daemon"))).unwrap()), "daemon");
        assert_eq!(name(t.node.check_install(&named(None)).unwrap()), "nobody", "the default is always allowed");
        refused(
            t.node.check_install(&named(Some("dynamic:61184"))).map(|_| ()).unwrap_err(),
            FailureKind::BadRequest,
            &["not a user name"],
        );
        // With dynamic users, a spec without run_as gets its cluster's,
        // unless the operator named a default user.
        let dynamic =
            TestNode::with_policy(RunAsPolicy { dynamic_users: Some((61184, 65519)), ..RunAsPolicy::default() });
        assert_eq!(dynamic.node.check_install(&named(None)).unwrap(), InstallUser::Dynamic);
        let named_default = TestNode::with_policy(RunAsPolicy {
            dynamic_users: Some((61184, 65519)),
            default_run_as: Some("daemon".into()),
            ..RunAsPolicy::default()
        });
        assert_eq!(name(named_default.node.check_install(&named(None)).unwrap()), "daemon");

        // A record naming root (installed before the rule, or the user
        // database changed since): its start is refused, nothing runs.
        let rooted = t.install("rooted", "root", spec(&["sleep", "100"]), &[]).await;
        refused(t.node.start(&rooted, 2).await, FailureKind::Start, &["uid 0", "allow_root = false"]);
        assert_eq!(t.record(&rooted).await.pid, None);
    }

    fn begin(id: &InstanceId, generation: u64) -> InstallBegin {
        InstallBegin {
            instance: id.clone(),
            cluster: crate::ids::ClusterId(uuid::Uuid::from_u128(1)),
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
