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
                let fut = this.fut.take();
                let _ = catch_unwind(AssertUnwindSafe(move || drop(fut)));
                if let Some(report) = this.on_panic.take() {
                    report(panic_message(payload.as_ref()));
                }
                Poll::Ready(())
            }
        }
    }
}

/// The message of a panic payload (`panic!` with a string, or formatted).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
