//! The gate's behaviour on one thread, as an arbiter runs it.

use super::*;
use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

/// Runs `f` with tasks spawned on this thread, as on an arbiter.
async fn on_one_thread<F: Future>(f: F) -> F::Output {
    tokio::task::LocalSet::new().run_until(f).await
}

/// Bulk work does not run while a request is urgent, runs as soon as
/// the last mark is gone, and keeps what it was waiting for.
#[tokio::test]
async fn bulk_work_waits_for_urgent_requests_and_loses_nothing() {
    on_one_thread(async {
        let gate = Arc::new(Priority::default());
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let steps = Rc::new(Cell::new(0));
        let first = gate.urgent();
        let second = gate.urgent();
        let work = {
            let (gate, steps) = (gate.clone(), steps.clone());
            tokio::task::spawn_local(async move {
                gate.gated(async {
                    steps.set(1);
                    let v = rx.await.expect("sent");
                    steps.set(2);
                    v
                })
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(steps.get(), 0, "bulk work ran while a request was urgent");
        tx.send(7).expect("receiver alive");
        drop(first);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(steps.get(), 0, "one of two urgent requests is still waiting");
        drop(second);
        let v = tokio::time::timeout(Duration::from_secs(5), work).await.expect("woken").expect("joined");
        assert_eq!((v, steps.get()), (7, 2), "the answer sent while parked was kept");
        assert!(!gate.is_held());
    })
    .await;
}

/// An operation's poll that has used its slice lets the thread go: a
/// task woken meanwhile runs before the operation's remaining ready
/// commands, not after all of them.
#[tokio::test]
async fn a_spent_slice_lets_other_tasks_run_between_commands() {
    on_one_thread(async {
        let gate = Arc::new(Priority::default());
        let done = Rc::new(Cell::new(0u32));
        let seen_at = Rc::new(Cell::new(None::<u32>));
        // 40 commands, each ready at once and busy for 1 ms.
        let op = {
            let (gate, done) = (gate.clone(), done.clone());
            tokio::task::spawn_local(sliced(async move {
                let gate = &gate;
                let done = &done;
                futures::future::join_all((0..40).map(|_| {
                    gate.gated(async move {
                        let t = Instant::now();
                        while t.elapsed() < Duration::from_millis(1) {}
                        done.set(done.get() + 1);
                    })
                }))
                .await
            }))
        };
        let other = {
            let (done, seen_at) = (done.clone(), seen_at.clone());
            tokio::task::spawn_local(async move { seen_at.set(Some(done.get())) })
        };
        other.await.expect("joined");
        op.await.expect("joined");
        assert_eq!(done.get(), 40);
        let at = seen_at.get().expect("the other task ran");
        assert!(at < 10, "the other task waited for {at} of 40 one-millisecond commands (slice {SLICE:?})");
    })
    .await;
}

/// An operation's own work (between its commands) parks while a
/// request is urgent, and keeps what it was waiting for; let through,
/// it does not use up its poll's slice: its first command still runs
/// in that same poll, however long the work before it took.
#[tokio::test]
async fn an_operations_own_work_waits_for_requests_without_taking_its_commands_turn() {
    on_one_thread(async {
        let gate = Arc::new(Priority::default());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let step = Rc::new(Cell::new(0));
        let polls = Rc::new(Cell::new(0u32));
        let mark = gate.urgent();
        let op = {
            let (gate, step, polls) = (gate.clone(), step.clone(), polls.clone());
            let mut op = Box::pin(sliced(async move {
                gate.behind_requests(async {
                    rx.await.expect("sent");
                    step.set(1);
                    // Longer than a slice: a command after it would
                    // wait for the next poll if this took its turn.
                    let t = Instant::now();
                    while t.elapsed() < SLICE * 2 {}
                    gate.gated(async { step.set(2) }).await;
                })
                .await
            }));
            tokio::task::spawn_local(std::future::poll_fn(move |cx| {
                polls.set(polls.get() + 1);
                op.as_mut().poll(cx)
            }))
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        tx.send(()).expect("receiver alive");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(step.get(), 0, "the operation's own work ran while a request was urgent");
        let before = polls.get();
        drop(mark);
        tokio::time::timeout(Duration::from_secs(5), op).await.expect("woken").expect("joined");
        assert_eq!(step.get(), 2, "the answer sent while parked was kept");
        assert_eq!(polls.get() - before, 1, "the command waited for another poll: its turn was taken");
    })
    .await;
}

/// Requests back to back keep the gate closed; bulk work still runs
/// once it has waited [`MAX_HOLD`]: slowed, never stopped.
#[tokio::test]
async fn requests_back_to_back_hold_bulk_work_at_most_max_hold() {
    on_one_thread(async {
        let gate = Arc::new(Priority::default());
        let done = Rc::new(Cell::new(false));
        let mut mark = gate.urgent();
        let work = {
            let (gate, done) = (gate.clone(), done.clone());
            tokio::task::spawn_local(async move { gate.gated(async { done.set(true) }).await })
        };
        // A new request every 10 ms, each answered 10 ms later: the
        // gate never opens.
        let started = Instant::now();
        while !done.get() && started.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let next = gate.urgent();
            drop(std::mem::replace(&mut mark, next));
            tokio::task::yield_now().await;
        }
        let waited = started.elapsed();
        assert!(gate.is_held(), "the gate stayed closed throughout");
        assert!(done.get(), "bulk work never ran under requests back to back");
        assert!(waited >= MAX_HOLD, "bulk work ran after {waited:?}, before {MAX_HOLD:?}");
        assert!(waited < MAX_HOLD * 4, "bulk work waited {waited:?} for a hold of {MAX_HOLD:?}");
        work.await.expect("joined");
        drop(mark);
        assert!(!gate.is_held());
    })
    .await;
}

/// Work already running parks at its next poll: an answer arriving
/// while a request is urgent is taken once the request is answered.
#[tokio::test]
async fn running_work_parks_at_its_next_poll() {
    on_one_thread(async {
        let gate = Arc::new(Priority::default());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let done = Rc::new(Cell::new(false));
        let work = {
            let (gate, done) = (gate.clone(), done.clone());
            tokio::task::spawn_local(async move {
                gate.gated(async {
                    rx.await.expect("sent");
                    done.set(true);
                })
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let mark = gate.urgent();
        tx.send(()).expect("receiver alive");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!done.get(), "the answer was taken while a request was urgent");
        drop(mark);
        tokio::time::timeout(Duration::from_secs(5), work).await.expect("woken").expect("joined");
        assert!(done.get());
    })
    .await;
}

/// The arbiter's thread runs lowered, is raised while a mark taken on
/// another thread (as the API's) is held, and is lowered again when
/// the last of two marks goes elsewhere; a mark that goes on the
/// thread itself (an answered request) leaves it raised until its next
/// bulk work, so the answer goes out first. Once the thread has ended,
/// its id is no longer touched. The kernel's view, from `/proc`.
#[test]
fn the_thread_is_raised_while_a_request_waits_for_it() {
    use crate::thread_nice::nice_in_proc;
    enum Do {
        Drop(Urgent),
        Bulk,
        End,
    }
    let gate = Arc::new(Priority::default());
    let (to_main, from_arbiter) = std::sync::mpsc::channel();
    let (to_arbiter, orders) = std::sync::mpsc::channel::<Do>();
    let arbiter = {
        let gate = gate.clone();
        std::thread::spawn(move || {
            let tid = rustix::thread::gettid().as_raw_nonzero().get();
            let base = nice_in_proc(tid);
            gate.lower_thread(10);
            to_main.send((tid, base)).expect("main waits");
            for order in orders {
                match order {
                    Do::Drop(mark) => drop(mark),
                    Do::Bulk => futures::executor::block_on(gate.gated(async {})),
                    Do::End => return,
                }
                to_main.send((0, 0)).expect("main waits");
            }
        })
    };
    let (tid, base) = from_arbiter.recv().expect("the arbiter started");
    let on_arbiter = |order: Do| {
        to_arbiter.send(order).expect("the arbiter listens");
        from_arbiter.recv().expect("done");
    };
    let low = (base + 10).min(19);
    assert_ne!(low, base, "cannot test: the process already runs at nice {base}");
    assert_eq!(nice_in_proc(tid), low, "bulk work runs lowered (needs CAP_SYS_NICE, as root in CI)");
    let first = gate.urgent();
    assert_eq!(nice_in_proc(tid), base, "raised while a request waits");
    let second = gate.urgent();
    drop(first);
    assert_eq!(nice_in_proc(tid), base, "still raised: a request still waits");
    drop(second);
    assert_eq!(nice_in_proc(tid), low, "lowered once no request waits");

    let answered = gate.urgent();
    assert_eq!(nice_in_proc(tid), base);
    on_arbiter(Do::Drop(answered));
    assert_eq!(nice_in_proc(tid), base, "the thread that answered stays raised until its next bulk work");
    on_arbiter(Do::Bulk);
    assert_eq!(nice_in_proc(tid), low, "lowered before its bulk work ran");

    to_arbiter.send(Do::End).expect("the arbiter listens");
    arbiter.join().expect("the arbiter's thread");
    assert!(lock(&gate.thread).nice.is_none(), "the ended thread's id is forgotten");
    drop(gate.urgent());
}

/// Arbiters sharing a gate: a request to an actor on one holds bulk work
/// on the other thread too (they share the cores), and raises only its
/// own thread's priority; the other's bulk work runs once it is answered.
#[test]
fn a_request_on_one_thread_holds_bulk_work_on_every_thread_sharing_the_gate() {
    use std::sync::atomic::AtomicU32;
    let gate = Arc::new(Gate::default());
    let (here, there) = (Arc::new(Priority::sharing(gate.clone())), Arc::new(Priority::sharing(gate.clone())));
    let mark = here.urgent();
    assert!(here.is_held() && !there.is_held(), "only the request's own thread counts it (and is raised)");
    assert!(gate.is_closed());
    let steps = Arc::new(AtomicU32::new(0));
    let other = {
        let (there, steps) = (there.clone(), steps.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(on_one_thread(async move {
                there.gated(async { steps.store(1, Ordering::SeqCst) }).await;
                there.behind_requests(async { steps.store(2, Ordering::SeqCst) }).await;
            }))
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(steps.load(Ordering::SeqCst), 0, "bulk work on the other thread ran while a request was urgent");
    drop(mark);
    other.join().expect("the other thread's bulk work ended once the request was answered");
    assert_eq!(steps.load(Ordering::SeqCst), 2);
    assert!(!gate.is_closed());
}

/// Each arbiter of `Priority::default()` has a gate of its own: a request
/// on one does not hold another's bulk work (unit tests and harnesses).
#[tokio::test]
async fn priorities_with_gates_of_their_own_do_not_hold_each_other() {
    on_one_thread(async {
        let (a, b) = (Arc::new(Priority::default()), Arc::new(Priority::default()));
        let _mark = a.urgent();
        let ran = tokio::time::timeout(Duration::from_secs(5), b.gated(async { 7 })).await;
        assert_eq!(ran.ok(), Some(7), "b's bulk work waited for a's request");
    })
    .await;
}

/// One request held long (a slow write): bulk work that parked under it
/// is let through by the thread's tick once the gate has been closed
/// [`MAX_HOLD`], not only when the request is answered.
#[tokio::test]
async fn work_parked_under_one_slow_request_goes_at_the_tick_after_max_hold() {
    on_one_thread(async {
        let priority = Arc::new(Priority::default());
        let mark = priority.urgent();
        let done = Rc::new(Cell::new(false));
        let work = {
            let (priority, done) = (priority.clone(), done.clone());
            tokio::task::spawn_local(async move { priority.gated(async { done.set(true) }).await })
        };
        let ticks = tokio::task::spawn_local(measure_lag("test".into(), Some(priority.clone())));
        let started = Instant::now();
        while !done.get() && started.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let waited = started.elapsed();
        assert!(priority.is_held(), "the one request is still waiting");
        assert!(done.get(), "parked bulk work waited for the request's answer");
        assert!(waited >= MAX_HOLD, "bulk work ran after {waited:?}, before {MAX_HOLD:?}");
        work.await.expect("joined");
        ticks.abort();
        drop(mark);
    })
    .await;
}
