//! Rolling batches on the real system: a config change that restarts a
//! role's members takes them down a quarter of the role at a time (2 of 8),
//! and one at a time in a quorum role (`count.odd`), even when the request
//! asks for more. Seen three ways: on the processes themselves, in the event
//! log's instance statuses, and in the operation's record.
//!
//! The processes keep a ledger: every start script appends `up <instance>`
//! and its TERM trap `down <instance>` to one file shared by every instance
//! (the agents all run on this machine). What its order proves needs no
//! clock: a member turns healthy only after it wrote `up` (its health check
//! waits for the file it touches next), and a batch is stopped only once the
//! one before is healthy again; so the ledger never shows more than a batch
//! down, and each batch's lines come before the next one's. That a whole
//! batch is down together is a matter of timing, made wide: a stopping
//! member lingers `STOP_DELAY` after writing `down`, so its partner in the
//! batch, stopped at the same moment, writes `down` long before the first
//! one is back.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::sse::SseReader;
use crate::common::{PackageBuilder, TestEnv, dir_of, id_of, pid_alive, pid_of, role_instances};

const WAIT: Duration = Duration::from_secs(60);

/// Up once it wrote `up` and touched `data/ready`; on TERM, writes `down`
/// and drains for `STOP_DELAY` seconds before it exits (deaf to the TERM
/// the agent also sends to processes that appear during a stop).
const START: &str = r#"set -eu
rm -f data/ready
trap 'rm -f data/ready; echo "down $FLOTILLA_INSTANCE" >> "$LEDGER"; trap "" TERM; sleep "$STOP_DELAY"; exit 0' TERM
echo "up $FLOTILLA_INSTANCE" >> "$LEDGER"
touch data/ready
sleep 100000 &
wait
"#;

const READY: &str = "test -f data/ready\n";

/// One role `member` with `count`, a file that changes with the config
/// (default change mode: restart), and the ledger at `ledger`.
fn package(name: &str, count: &str, ledger: &Path, stop_delay: &str) -> PackageBuilder {
    let spec = format!(
        r#"
[component]
name = "{name}"
version = "1.0.0"

[config]
greeting = {{ type = "string", default = "hello" }}

[[roles]]
name = "member"
count = {count}
start = ["bin/start.sh"]
stop_grace = "10s"
start_timeout = "20s"
health = {{ cmd = ["bin/ready.sh"] }}
env = {{ LEDGER = "{ledger}", STOP_DELAY = "{stop_delay}" }}

[[roles.files]]
path = "conf/greeting"
template = "{{{{ cluster.config.greeting }}}}\n"
"#,
        ledger = ledger.display()
    );
    PackageBuilder::new(name, "1.0.0").spec(&spec).script("bin/start.sh", START).script("bin/ready.sh", READY)
}

/// An empty ledger in the env's temp dir that any instance (each cluster runs
/// as a user of its own) may append to.
fn new_ledger(env: &TestEnv) -> PathBuf {
    let root = env.master_dir().parent().expect("the env's temp dir").to_path_buf();
    let path = root.join("ledger");
    std::fs::write(&path, "").expect("create the ledger");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod the ledger");
    path
}

/// A line of the ledger, or a change seen in the event log: a member went
/// down or came up.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Move {
    Down(String),
    Up(String),
}

impl Move {
    fn id(&self) -> &str {
        match self {
            Move::Down(id) | Move::Up(id) => id,
        }
    }
}

fn read_ledger(path: &Path) -> Vec<Move> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| match l.split_once(' ') {
            Some(("down", id)) => Move::Down(id.to_string()),
            Some(("up", id)) => Move::Up(id.to_string()),
            _ => panic!("{}: bad line {l:?}", path.display()),
        })
        .collect()
}

/// `moves` by ordinal (`ids` are by ordinal, from 1), for messages:
/// `-3 -4 +3 +4`.
fn show(moves: &[Move], ids: &[String]) -> String {
    let ord = |id: &str| ids.iter().position(|i| i == id).map_or(format!("?{id}"), |n| (n + 1).to_string());
    moves
        .iter()
        .map(|m| match m {
            Move::Down(id) => format!("-{}", ord(id)),
            Move::Up(id) => format!("+{}", ord(id)),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// How many of `ids` are down after each move, all up at first; panics on
/// a move that does not follow (down twice, up while up, a stranger).
fn down_counts(moves: &[Move], ids: &[String]) -> Vec<usize> {
    let mut down = BTreeSet::new();
    moves
        .iter()
        .map(|m| {
            assert!(ids.iter().any(|i| i == m.id()), "{m:?} is not a member: {}", show(moves, ids));
            match m {
                Move::Down(id) => assert!(down.insert(id.clone()), "{id} down twice: {}", show(moves, ids)),
                Move::Up(id) => assert!(down.remove(id), "{id} up without going down: {}", show(moves, ids)),
            }
            down.len()
        })
        .collect()
}

/// Every member went down exactly once, then came up.
fn assert_each_restarted_once(moves: &[Move], ids: &[String], what: &str) {
    for id in ids {
        let mine: Vec<&Move> = moves.iter().filter(|m| m.id() == id).collect();
        assert_eq!(
            mine,
            [&Move::Down(id.clone()), &Move::Up(id.clone())],
            "{what}: {id} was not restarted exactly once: {}",
            show(moves, ids)
        );
    }
    assert_eq!(moves.len(), 2 * ids.len(), "{what}: {}", show(moves, ids));
}

/// What one config change did.
struct Rolled {
    /// `GET /operations/{id}` once it ended.
    op: Value,
    /// The ledger's lines written during it.
    ledger: Vec<Move>,
    /// The instance statuses the event log shows during it, as moves:
    /// leaving Running is down, reaching it again is up.
    statuses: Vec<Move>,
    /// The instances the reconfigure step's results say were restarted, in
    /// the record's order.
    restarted: Vec<String>,
}

/// PATCHes `/clusters/{cluster}/config` with `body`, waits for the
/// operation to succeed, and gathers what it did.
async fn reconfigure(env: &TestEnv, cluster: &str, ids: &[String], ledger: &Path, body: Value) -> Rolled {
    let before = read_ledger(ledger).len();
    let op = env.run_op_patch(&format!("/clusters/{cluster}/config"), body).await;
    env.assert_succeeded(&op);
    assert_eq!(op["kind"], "Reconfigure", "{op:#}");
    let op_id = op["id"].as_str().expect("op id").to_string();
    let ledger = read_ledger(ledger)[before..].to_vec();

    // The event log from its start, this cluster's instance statuses and
    // operation ends, up to this operation's end.
    let query = format!("?after=0&cluster={cluster}&kind=operation.created,operation.ended,instance.status");
    let mut sse = SseReader::open(&env.client, &env.api, &query, None).await;
    let events = sse.until(WAIT, |e| e.kind == "operation.ended" && e.data["data"]["operation"] == op_id).await;
    let from = events
        .iter()
        .position(|e| e.kind == "operation.created" && e.data["data"]["operation"] == op_id)
        .unwrap_or_else(|| panic!("no operation.created for {op_id}: {events:#?}"));
    let mut running: BTreeMap<String, bool> = ids.iter().map(|id| (id.clone(), true)).collect();
    let mut statuses = Vec::new();
    for e in events[from..].iter().filter(|e| e.kind == "instance.status") {
        let id = e.data["data"]["instance"].as_str().expect("instance").to_string();
        let now = e.data["data"]["status"] == "Running";
        let was = running.insert(id.clone(), now).unwrap_or_else(|| panic!("an event of a stranger: {e:?}"));
        match (was, now) {
            (true, false) => statuses.push(Move::Down(id)),
            (false, true) => statuses.push(Move::Up(id)),
            _ => {}
        }
    }

    let step = op["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .find(|s| s["name"] == "reconfigure")
        .unwrap_or_else(|| panic!("no reconfigure step: {op:#}"));
    let restarted = step["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter(|r| r["message"] == "restarted with its new files")
        .map(|r| r["instance"].as_str().expect("instance").to_string())
        .collect();
    Rolled { op, ledger, statuses, restarted }
}

/// Each member runs a new process, the old one gone, with the new file.
async fn assert_restarted_with(env: &TestEnv, cluster: &str, before: &[Value], greeting: &str) {
    let after = role_instances(&env.cluster(cluster).await, "member");
    assert_eq!(after.len(), before.len());
    for (old, new) in before.iter().zip(&after) {
        assert_eq!(id_of(old), id_of(new));
        assert_eq!(new["status"], "Running", "{new:#}");
        assert_ne!(pid_of(old), pid_of(new), "{} kept its process", id_of(new));
        assert!(!pid_alive(pid_of(old)), "{}'s old process {} still runs", id_of(new), pid_of(old));
        assert!(pid_alive(pid_of(new)), "{}'s new process {} is not running", id_of(new), pid_of(new));
        let file = std::fs::read_to_string(dir_of(new).join("conf/greeting")).expect("conf/greeting");
        assert_eq!(file, format!("{greeting}\n"), "{}", id_of(new));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_change_restarts_a_role_of_eight_two_at_a_time() {
    let env = TestEnv::start("batches").await;
    let ledger = new_ledger(&env);
    env.upload(&package("pool", "{ min = 1, max = 8 }", &ledger, "2")).await;
    let body =
        json!({"name": "b8", "package": {"name": "pool", "version": "1.0.0"}, "roles": {"member": {"count": 8}}});
    let before = role_instances(&env.create_active(body).await, "member");
    let ids: Vec<String> = before.iter().map(id_of).collect();
    assert_eq!(ids.len(), 8);
    // The create's starts, one `up` each.
    let created = read_ledger(&ledger);
    assert_eq!(created.len(), 8, "{created:?}");
    assert!(created.iter().all(|m| matches!(m, Move::Up(_))), "{created:?}");

    let r = reconfigure(&env, "b8", &ids, &ledger, json!({"config": {"greeting": "bonjour"}})).await;
    assert_restarted_with(&env, "b8", &before, "bonjour").await;

    // The processes: each member down once and back; never more than two
    // down at once, and two down together (a batch of 1 or of 8 fails).
    assert_each_restarted_once(&r.ledger, &ids, "ledger");
    let counts = down_counts(&r.ledger, &ids);
    let seen = show(&r.ledger, &ids);
    assert!(counts.iter().all(|n| *n <= 2), "more than 2 of 8 down at once (25 % is 2): {seen}");
    assert!(counts.contains(&2), "never 2 down together: batches of 1, not 25 % of 8: {seen}");
    // Batches, not a sliding window: the members in the order they went
    // down, in pairs; each pair's lines all come before the next pair's.
    let downs: Vec<&str> = r.ledger.iter().filter(|m| matches!(m, Move::Down(_))).map(Move::id).collect();
    let pairs: Vec<BTreeSet<&str>> = downs.chunks(2).map(|c| c.iter().copied().collect()).collect();
    let pair_of = |id: &str| pairs.iter().position(|p| p.contains(id)).expect("a pair");
    let order: Vec<usize> = r.ledger.iter().map(|m| pair_of(m.id())).collect();
    assert!(order.windows(2).all(|w| w[0] <= w[1]), "a batch began before the one before it was back: {seen}");
    assert_eq!(pairs.len(), 4, "{seen}");

    // The event log says the same: statuses leave Running two at a time.
    assert_each_restarted_once(&r.statuses, &ids, "event log");
    let counts = down_counts(&r.statuses, &ids);
    let seen_events = show(&r.statuses, &ids);
    assert_eq!(counts.iter().max(), Some(&2), "instances not Running at once, per the event log: {seen_events}");

    // The record: one restart per member, in the order of the batches.
    assert_eq!(r.op["params"]["config"], json!({"greeting": "bonjour"}), "{:#}", r.op);
    assert_eq!(r.op["params"]["batch"], Value::Null, "no batch asked for, none recorded: {:#}", r.op);
    assert_eq!(r.restarted.len(), 8, "{:#}", r.op);
    let recorded: Vec<BTreeSet<&str>> = r.restarted.chunks(2).map(|c| c.iter().map(String::as_str).collect()).collect();
    assert_eq!(recorded, pairs, "the record's restarts, in pairs, against the ledger's batches: {seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_change_restarts_a_quorum_role_one_at_a_time_even_when_asked_for_more() {
    let env = TestEnv::start("batches-odd").await;
    let ledger = new_ledger(&env);
    env.upload(&package("quorum", "{ min = 1, max = 5, odd = true }", &ledger, "1")).await;
    let body =
        json!({"name": "q5", "package": {"name": "quorum", "version": "1.0.0"}, "roles": {"member": {"count": 5}}});
    let mut before = role_instances(&env.create_active(body).await, "member");
    let ids: Vec<String> = before.iter().map(id_of).collect();
    assert_eq!(ids.len(), 5);

    // The default (25 % of 5 would be 1 anyway), then a batch of 5: the
    // quorum rule holds either way.
    for (greeting, body) in [
        ("bonjour", json!({"config": {"greeting": "bonjour"}})),
        ("hallo", json!({"config": {"greeting": "hallo"}, "batch": 5})),
    ] {
        let asked = body.get("batch").cloned().unwrap_or(Value::Null);
        let r = reconfigure(&env, "q5", &ids, &ledger, body).await;
        assert_restarted_with(&env, "q5", &before, greeting).await;
        let seen = show(&r.ledger, &ids);

        // The processes: each member goes down and is back before the next
        // one goes down.
        assert_each_restarted_once(&r.ledger, &ids, "ledger");
        let counts = down_counts(&r.ledger, &ids);
        assert_eq!(counts.iter().max(), Some(&1), "{greeting}: more than one quorum member down at once: {seen}");
        assert!(
            r.ledger.chunks(2).all(|p| matches!(p, [Move::Down(a), Move::Up(b)] if a == b)),
            "{greeting}: not one at a time: {seen}"
        );

        // The event log: one instance not Running at a time.
        assert_each_restarted_once(&r.statuses, &ids, "event log");
        let counts = down_counts(&r.statuses, &ids);
        let seen_events = show(&r.statuses, &ids);
        assert_eq!(counts.iter().max(), Some(&1), "{greeting}: per the event log: {seen_events}");

        // The record: a restart per member, in the order the ledger saw.
        let order: Vec<&str> = r.ledger.iter().filter(|m| matches!(m, Move::Down(_))).map(Move::id).collect();
        assert_eq!(r.restarted, order, "{greeting}: the record's order against the ledger's: {:#}", r.op);
        assert_eq!(r.op["params"]["batch"], asked, "the batch asked for, as recorded: {:#}", r.op);
        before = role_instances(&env.cluster("q5").await, "member");
    }
}
