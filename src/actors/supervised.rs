//! Starting an actor so that a panic in it is reported, not just lost.
//!
//! A panic in an actix handler (or in a future the actor spawned) unwinds
//! out of the actor's context future: tokio drops the task, the mailbox
//! closes, and every later message fails (the API answered `503` for the
//! cluster until the master restarted). actix's own `Supervisor` restarts
//! an actor that *stops*, not one that panics, and it would restart it
//! with the in-memory state the panic interrupted. So the context future
//! runs inside [`Guarded`], which catches the unwind, drops the actor (its
//! state is not trusted after a panic) and calls `on_panic` with the panic
//! message: the supervisor starts a new actor from the stored records
//! (`Supervisor`'s `ClusterPanicked`).

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use actix::dev::{ContextFut, channel};
use actix::prelude::*;

/// Called once, on the actor's thread, with the panic's message.
pub type OnPanic = Box<dyn FnOnce(String)>;

/// Starts an actor on `arbiter` like `Actor::start_in_arbiter`; `on_panic`
/// (built on the arbiter's thread) is told if it panics.
pub fn start_in_arbiter<A, F, P>(arbiter: &ArbiterHandle, f: F, on_panic: P) -> Addr<A>
where
    A: Actor<Context = Context<A>>,
    F: FnOnce(&mut Context<A>) -> A + Send + 'static,
    P: FnOnce() -> OnPanic + Send + 'static,
{
    let (tx, rx) = channel::channel(16);
    arbiter.spawn_fn(move || {
        let mut ctx = Context::with_receiver(rx);
        let act = f(&mut ctx);
        let fut = ctx.into_future(act);
        actix::spawn(Guarded { fut: Some(fut), on_panic: Some(on_panic()) });
    });
    Addr::new(tx)
}

/// An actor's context future that reports a panic instead of unwinding.
pub struct Guarded<A: Actor<Context = Context<A>>> {
    fut: Option<ContextFut<A, Context<A>>>,
    on_panic: Option<OnPanic>,
}

impl<A: Actor<Context = Context<A>>> Future for Guarded<A> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<()> {
        let this = self.get_mut();
        let Some(fut) = this.fut.as_mut() else { return Poll::Ready(()) };
        match catch_unwind(AssertUnwindSafe(|| Pin::new(fut).poll(cx))) {
            Ok(poll) => poll,
            Err(payload) => {
                // The actor and what it spawned go; a panic in their drop
                // (state the first one left half-changed) is caught too.
                // Its `stopped` runs inside this drop: it can tell
                // ([`dropped_after_panic`]) and leave to `on_panic` what a
                // deliberate stop would undo (its listing, say).
                let fut = this.fut.take();
                AFTER_PANIC.with(|p| p.set(true));
                let _ = catch_unwind(AssertUnwindSafe(move || drop(fut)));
                AFTER_PANIC.with(|p| p.set(false));
                if let Some(report) = this.on_panic.take() {
                    report(panic_message(payload.as_ref()));
                }
                Poll::Ready(())
            }
        }
    }
}

thread_local! {
    static AFTER_PANIC: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the actor being stopped on this thread is being dropped after
/// a panic (its supervisor will act on it), not stopped deliberately.
pub fn dropped_after_panic() -> bool {
    AFTER_PANIC.with(|p| p.get())
}

/// The message of a panic payload (`panic!` with a string, or formatted).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// The master's supervised tasks (`supervision::TREE`: the agent
/// listener, the node watcher, the leaked-instance sweep), each with the
/// switch its `kill` verb pulls, and the cause of a failure the master
/// cannot survive (a child given up under `GiveUp::ExitMaster`): the
/// master exits with it, never left half working.
#[derive(Default)]
pub struct Tasks {
    kills: std::sync::Mutex<std::collections::HashMap<&'static str, TaskHandle>>,
    fatal: std::sync::Mutex<Option<String>>,
    fatal_news: tokio::sync::Notify,
}

impl Tasks {
    pub fn contains(&self, kind: &str) -> bool {
        self.kills.lock().unwrap_or_else(|p| p.into_inner()).contains_key(kind)
    }

    /// Stops task `kind` as if it failed ("killed by the operator"). A
    /// kill that would take it past its intensity (and so end the master)
    /// is refused, saying so: the operator's verb never stops the master.
    pub fn kill(&self, kind: &str) -> Result<(), String> {
        let kills = self.kills.lock().unwrap_or_else(|p| p.into_inner());
        let Some(t) = kills.get(kind) else { return Err(format!("no task {kind}")) };
        if t.killed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            // One kill per incarnation: a second one (a double click, a
            // retry) would wait and kill the next incarnation as it starts.
            return Err(format!("{kind} is being killed or restarted already; try again once it runs"));
        }
        let spec = super::supervision::spec(kind);
        let room = t.intensity.lock().unwrap_or_else(|p| p.into_inner()).room(spec, std::time::Instant::now());
        if room == 0 {
            t.killed.store(false, std::sync::atomic::Ordering::SeqCst);
            return Err(format!(
                "{kind} was restarted {} times within {}s: one more failure would end the master ({}); try again later",
                spec.intensity,
                spec.period.as_secs(),
                spec.describe()
            ));
        }
        t.kill.notify_one();
        Ok(())
    }

    /// Test hooks: task `kind`'s running incarnation panics. Unlike a
    /// kill it is never refused: past the intensity the master exits.
    pub fn inject_panic(&self, kind: &str) -> Result<(), String> {
        let tasks = self.kills.lock().unwrap_or_else(|p| p.into_inner());
        let t = tasks.get(kind).ok_or_else(|| format!("no task {kind}"))?;
        t.panic.notify_one();
        Ok(())
    }

    /// The master cannot go on: `cause` is why (the first one is kept).
    pub fn fatal(&self, cause: String) {
        tracing::error!(%cause, "the master cannot go on; it exits");
        self.fatal.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(cause);
        self.fatal_news.notify_one();
    }

    /// Why the master cannot go on, if it cannot.
    pub fn fatal_cause(&self) -> Option<String> {
        self.fatal.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until the master cannot go on; answers why.
    pub async fn fatal_failure(&self) -> String {
        loop {
            if let Some(c) = self.fatal.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                return c;
            }
            self.fatal_news.notified().await;
        }
    }
}

/// A supervised task's kill switch and restart count.
struct TaskHandle {
    kill: std::sync::Arc<tokio::sync::Notify>,
    /// Test hooks: the running incarnation panics.
    panic: std::sync::Arc<tokio::sync::Notify>,
    /// Set by a kill, cleared when the next incarnation runs.
    killed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    intensity: std::sync::Arc<std::sync::Mutex<super::supervision::Intensity>>,
}

/// Runs the long-lived task `kind` under its child spec
/// (`supervision::spec(kind)`): `make` starts an incarnation; one that
/// panics, ends, or is killed by the operator is started again after the
/// spec's backoff while within its intensity, and past it the master exits
/// with the cause ([`Tasks::fatal`]). Shown in `GET /actors` with its
/// restarts and last exit.
pub fn task<F, Fut>(shared: &super::Shared, kind: &'static str, make: F)
where
    F: Fn() -> Fut + 'static,
    Fut: Future<Output = Result<(), String>> + 'static,
{
    use futures::FutureExt;
    let spec = super::supervision::spec(kind);
    let stats = super::read_model::ActorStats::new(kind, kind, Some("master".into()));
    shared.read_model.register_actor(&stats);
    let handle = TaskHandle {
        kill: Default::default(),
        panic: Default::default(),
        killed: Default::default(),
        intensity: Default::default(),
    };
    let (kill, killed, intensity) = (handle.kill.clone(), handle.killed.clone(), handle.intensity.clone());
    let injected = handle.panic.clone();
    shared.tasks.kills.lock().unwrap_or_else(|p| p.into_inner()).insert(kind, handle);
    let tasks = shared.tasks.clone();
    actix::spawn(async move {
        let _live = super::live_tasks::LiveTask::new("supervised_task");
        loop {
            stats.set_state("running");
            killed.store(false, std::sync::atomic::Ordering::SeqCst);
            let incarnation = make();
            let injected = injected.clone();
            let run = AssertUnwindSafe(async move {
                tokio::select! {
                    ended = incarnation => ended,
                    () = injected.notified() => panic!("a panic injected by a test hook ({kind})"),
                }
            })
            .catch_unwind();
            let reason = tokio::select! {
                ended = run => match ended {
                    Ok(Ok(())) => "ended".to_string(),
                    Ok(Err(e)) => e,
                    Err(payload) => format!("panicked: {}", panic_message(payload.as_ref())),
                },
                () = kill.notified() => "killed by the operator".to_string(),
            };
            let failed = intensity.lock().unwrap_or_else(|p| p.into_inner()).failed(spec, std::time::Instant::now());
            match failed {
                Ok(n) => {
                    tracing::error!(task = kind, %reason, restart = n, "a supervised task failed; restarting it");
                    stats.exited(reason.clone(), true);
                    stats.end(Some(reason));
                    stats.set_state("restarting");
                    tokio::time::sleep(spec.backoff).await;
                }
                Err(n) => {
                    stats.exited(reason.clone(), false);
                    stats.set_state("failed");
                    tasks.fatal(format!("{kind} failed {} times within {}s: {reason}", n + 1, spec.period.as_secs()));
                    return;
                }
            }
        }
    });
}

/// Runs the one-shot task `work` as a temporary child of kind `kind`
/// (`supervision::spec(kind)`, `GiveUp::Reported`): never restarted (the
/// next one is another task), counted in `flotilla_live_tasks` while it
/// runs, and a panic in it is caught and reported (an error log and
/// `flotilla_task_failures_total{kind}`), not lost with a dropped task.
pub fn temporary(kind: &'static str, work: impl Future<Output = ()> + 'static) {
    use futures::FutureExt;
    debug_assert_eq!(super::supervision::spec(kind).give_up, super::supervision::GiveUp::Reported);
    let live = super::live_tasks::LiveTask::new(kind);
    actix::spawn(async move {
        let _live = live;
        if let Err(payload) = AssertUnwindSafe(work).catch_unwind().await {
            let reason = panic_message(payload.as_ref());
            tracing::error!(task = kind, %reason, "a temporary task panicked; its work is lost, nothing else");
            metrics::counter!("flotilla_task_failures_total", "kind" => kind).increment(1);
        }
    });
}

/// The store's writer thread is not restarted: its death, or one write
/// that the disk has not answered within `stall_limit`, ends the master
/// (`supervision::spec("store_writer")`), noticed within a second. Every
/// commit waits behind that write, so this is the deadline of them all: a
/// caller never times out on a write that may still land.
/// `stats` is the writer's row in `GET /actors`: `running`, `waiting Ns
/// for one write` while the disk is slow, `failed` with the cause at the end.
pub async fn watch_store_writer(
    store: std::sync::Arc<dyn crate::storage::meta::MetaStore>,
    tasks: std::sync::Arc<Tasks>,
    stall_limit: Duration,
    stats: std::sync::Arc<super::read_model::ActorStats>,
) {
    let fatal = |cause: String| {
        stats.exited(cause.clone(), false);
        stats.set_state("failed");
        tasks.fatal(cause);
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        if !store.writer_alive() {
            return fatal("the store's writer thread died: nothing can be recorded".into());
        }
        let stuck = store.writer_stuck_for();
        if let Some(stuck) = stuck.filter(|s| *s >= stall_limit) {
            return fatal(format!(
                "the store's writer has waited {}s for one write (the limit, store_stall_limit, is {}s): \
                 the disk does not answer, nothing can be recorded",
                stuck.as_secs(),
                stall_limit.as_secs()
            ));
        }
        match stuck.filter(|s| *s >= Duration::from_secs(1)) {
            Some(s) => stats.set_state(format!("waiting {}s for one write", s.as_secs())),
            None => stats.set_state("running"),
        }
    }
}
