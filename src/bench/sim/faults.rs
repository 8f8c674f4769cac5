//! A simulated agent's fault switches, which tests and load runs flip: a
//! slow reader (it stops reading its socket, at once or once an install's
//! bytes start coming), a frozen link (it stops reading and writing: a
//! half-open connection) and a dropped connection (it reconnects).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::Notify;

use super::agent::SimAgent;

/// Switches a test or a load run flips to inject faults.
#[derive(Debug, Default)]
pub struct Faults {
    /// Stop reading the socket (a slow reader).
    pub stalled: AtomicBool,
    /// Set `stalled` right after asking for the bytes of the next install
    /// (an agent whose disk hangs mid-install): the package's chunks pile
    /// up in the socket, which a stall before the install cannot show (the
    /// master waits for the answer to `InstallBegin` before any chunk).
    pub stall_on_install: AtomicBool,
    /// Stop reading and writing, heartbeats too, but keep the socket open
    /// (a half-open connection, as after a network partition).
    pub frozen: AtomicBool,
    /// Wakes the session after a switch flipped (either way).
    pub resumed: Notify,
    /// Wakes the session after a [`SimAgent::disconnect`].
    pub kick: Notify,
    /// Counts [`SimAgent::disconnect`] calls. A session ends once it sees
    /// the count move past what it was when the session began, however
    /// busy it was when the kick came: `Notify::notify_waiters` keeps no
    /// permit, so a kick while the session was not waiting (in the
    /// handshake, in a request's handling) was lost, and the session hung
    /// on where the test expected a reconnect.
    pub(super) kicks: AtomicU64,
    /// The writer parked by a frozen link.
    pub(super) writer: futures::task::AtomicWaker,
}

/// The socket's write half behind the `frozen` switch: while frozen every
/// write waits (the socket stays open, nothing is sent, not even a FIN).
pub(super) struct Gate<W> {
    pub(super) inner: W,
    pub(super) agent: Arc<SimAgent>,
}

impl<W: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Gate<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.agent.faults.frozen.load(Ordering::Relaxed) {
            self.agent.faults.writer.register(cx.waker());
            if self.agent.faults.frozen.load(Ordering::Relaxed) {
                return std::task::Poll::Pending;
            }
        }
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl SimAgent {
    /// Flips a fault switch and wakes the session.
    pub fn set_stalled(&self, yes: bool) {
        self.faults.stalled.store(yes, Ordering::SeqCst);
        self.faults.resumed.notify_waiters();
    }

    /// Stops reading once the next install's bytes are asked for; see
    /// [`Faults::stall_on_install`]. `set_stalled(false)` resumes.
    pub fn stall_at_next_install(&self) {
        self.faults.stall_on_install.store(true, Ordering::Relaxed);
    }

    pub fn set_frozen(&self, yes: bool) {
        self.faults.frozen.store(yes, Ordering::SeqCst);
        self.faults.resumed.notify_waiters();
        self.faults.writer.wake();
    }

    /// Drops the current connection; the agent dials again.
    pub fn disconnect(&self) {
        // Counted first, so a session that is not waiting now sees it when
        // it next looks (see `Faults::kicks`).
        self.faults.kicks.fetch_add(1, Ordering::SeqCst);
        self.faults.kick.notify_waiters();
    }
}
