//! `ReadLog`: an installed instance's stdout or stderr log, its last lines
//! or what follows an offset, bounded in bytes. The master polls with the
//! returned offset to follow a log, so the agent keeps no state per reader.
//!
//! The log sits in `logs/`, which belongs to the instance's user, and the
//! agent reading it is root: the file is opened through `agent::beneath`
//! (no link anywhere on the path, non-blocking, a regular file owned by the
//! instance's user; a link to `/etc/shadow`, a hard link to a root file or a
//! FIFO is refused, saying so). Reads are bounded: at most
//! [`MAX_READS_PER_INSTANCE`] at once per instance and
//! [`MAX_READS_PER_NODE`] per agent (a read past that is refused at once,
//! never queued), each at most [`MAX_LOG_CHUNK`] bytes and
//! [`READ_DEADLINE`] long.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Node, failure, lock, not_installed};
use crate::agent::beneath::{Dir, Expect, RelPath};
use crate::ids::InstanceId;
use crate::protocol::messages::{AgentResponse, FailureKind, LogFrom, LogStream};

/// The most one `ReadLog` answers, whatever it asks.
pub const MAX_LOG_CHUNK: u32 = 256 * 1024;
/// Log reads of one instance at once.
pub const MAX_READS_PER_INSTANCE: usize = 2;
/// Log reads on this agent at once (each may hold a blocking thread).
pub const MAX_READS_PER_NODE: usize = 8;
/// A read that has not answered by then is answered with a failure (its
/// slot stays taken until the blocking read really ends).
pub const READ_DEADLINE: Duration = Duration::from_secs(5);

/// The log reads under way, per instance and in all.
#[derive(Default)]
pub struct LogReads(Mutex<HashMap<InstanceId, usize>>);

/// One read's slot, given back when dropped.
struct ReadSlot(Arc<LogReads>, InstanceId);

impl LogReads {
    /// A slot for a read of `id`, or why there is none.
    fn take(self: &Arc<Self>, id: &InstanceId) -> Result<ReadSlot, String> {
        let mut map = lock(&self.0);
        let all: usize = map.values().sum();
        if all >= MAX_READS_PER_NODE {
            return Err(format!(
                "{all} log reads are under way on this agent (at most {MAX_READS_PER_NODE}); try again shortly"
            ));
        }
        let n = map.entry(id.clone()).or_default();
        if *n >= MAX_READS_PER_INSTANCE {
            return Err(format!(
                "{n} log reads of {id} are under way (at most {MAX_READS_PER_INSTANCE}); try again shortly"
            ));
        }
        *n += 1;
        Ok(ReadSlot(self.clone(), id.clone()))
    }
}

impl Drop for ReadSlot {
    fn drop(&mut self) {
        let mut map = lock(&self.0.0);
        if let Some(n) = map.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.1);
            }
        }
    }
}

impl Node {
    pub async fn read_log(&self, id: &InstanceId, stream: LogStream, from: LogFrom, max_bytes: u32) -> AgentResponse {
        // Installed is enough (a stopped instance's log is still there); the
        // slot's lock is not taken: reading never races a command's writes
        // beyond seeing a line half written.
        let installed = self.slot(id).record.try_lock().map_or(true, |g| g.is_some());
        if !installed || !id.is_safe_path_component() {
            return not_installed(id);
        }
        let slot = match self.log_reads.take(id) {
            Ok(slot) => slot,
            Err(why) => return failure(FailureKind::Busy, why),
        };
        let name = match stream {
            LogStream::Stdout => "stdout.log",
            LogStream::Stderr => "stderr.log",
        };
        let dir = self.instance_dir(id);
        let max = max_bytes.clamp(1, MAX_LOG_CHUNK) as u64;
        let task = tokio::task::spawn_blocking(move || {
            // Held until the read really ends, even past its deadline.
            let _slot = slot;
            let root = Dir::open(&dir)?;
            let owner = root.owner()?;
            let rel = RelPath::parse(&format!("logs/{name}"))?;
            match root.open_read(&rel, Expect { owner: Some(owner), single_link: false }) {
                Ok(file) => read(file, from, max).map_err(|e| crate::agent::beneath::BeneathError::Io {
                    op: "read",
                    path: dir.join("logs").join(name),
                    source: e,
                }),
                // A log that does not exist yet reads as empty.
                Err(e) if e.is_not_found() => Ok((Vec::new(), 0)),
                Err(e) => Err(e),
            }
        });
        match tokio::time::timeout(READ_DEADLINE, task).await {
            Ok(Ok(Ok((data, next_offset)))) => AgentResponse::LogChunk { data, next_offset },
            Ok(Ok(Err(e))) => {
                let kind = if e.is_refusal() { FailureKind::BadRequest } else { FailureKind::Internal };
                failure(kind, format!("reading {name} of {id}: {}", crate::error::ErrorChain(&e)))
            }
            Ok(Err(e)) => failure(FailureKind::Internal, format!("reading {name} of {id}: {e}")),
            Err(_) => failure(
                FailureKind::Timeout,
                format!("reading {name} of {id} took longer than {} s", READ_DEADLINE.as_secs()),
            ),
        }
    }
}

/// Reads the open log `f` from `from`, at most `max` bytes: (bytes, offset
/// after them).
fn read(mut f: File, from: LogFrom, max: u64) -> std::io::Result<(Vec<u8>, u64)> {
    let len = f.metadata()?.len();
    let start = match from {
        // Shorter than the offset: the log was cut; start again.
        LogFrom::Offset(o) if o <= len => o,
        LogFrom::Offset(_) => 0,
        LogFrom::Tail(_) => len.saturating_sub(max),
    };
    f.seek(SeekFrom::Start(start))?;
    let mut data = Vec::with_capacity((len - start).min(max) as usize);
    f.by_ref().take(max).read_to_end(&mut data)?;
    let next = start + data.len() as u64;
    if let LogFrom::Tail(n) = from {
        // Keep the last `n` whole lines of what was read.
        let body = data.strip_suffix(b"\n").unwrap_or(&data);
        let cut = body.iter().enumerate().rev().filter(|(_, b)| **b == b'\n').nth(n.saturating_sub(1) as usize);
        let keep_from = match (n, cut) {
            (0, _) => data.len(),
            (_, Some((i, _))) => i + 1,
            // Fewer lines than asked: all of them, but not a cut first line
            // when the read started inside the file.
            (_, None) if start > 0 => data.iter().position(|b| *b == b'\n').map_or(data.len(), |i| i + 1),
            (_, None) => 0,
        };
        data.drain(..keep_from);
    }
    Ok((data, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads `p` as the agent does once it is open (missing: empty).
    fn read_at(p: &std::path::Path, from: LogFrom, max: u64) -> std::io::Result<(Vec<u8>, u64)> {
        match File::open(p) {
            Ok(f) => read(f, from, max),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((Vec::new(), 0)),
            Err(e) => Err(e),
        }
    }

    #[test]
    fn tails_and_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("stdout.log");
        let read = read_at;
        assert_eq!(read(&p, LogFrom::Tail(3), 1024).unwrap(), (Vec::new(), 0), "no log yet: empty");
        std::fs::write(&p, "one\ntwo\nthree\nfour\n").unwrap();
        let (d, next) = read(&p, LogFrom::Tail(2), 1024).unwrap();
        assert_eq!((String::from_utf8(d).unwrap(), next), ("three\nfour\n".to_string(), 19));
        let (d, _) = read(&p, LogFrom::Tail(10), 1024).unwrap();
        assert_eq!(String::from_utf8(d).unwrap(), "one\ntwo\nthree\nfour\n");
        let (d, _) = read(&p, LogFrom::Tail(0), 1024).unwrap();
        assert!(d.is_empty());
        // Bounded: the last 8 bytes hold "e\nfour\n"; the cut line is left out.
        let (d, _) = read(&p, LogFrom::Tail(5), 8).unwrap();
        assert_eq!(String::from_utf8(d).unwrap(), "four\n");
        let (d, next) = read(&p, LogFrom::Offset(14), 1024).unwrap();
        assert_eq!((String::from_utf8(d).unwrap(), next), ("four\n".to_string(), 19));
        let (d, next) = read(&p, LogFrom::Offset(19), 1024).unwrap();
        assert_eq!((d.len(), next), (0, 19), "nothing new");
        std::fs::write(&p, "new\n").unwrap();
        let (d, next) = read(&p, LogFrom::Offset(19), 1024).unwrap();
        assert_eq!((String::from_utf8(d).unwrap(), next), ("new\n".to_string(), 4), "a cut log starts over");
    }

    #[test]
    fn reads_are_bounded_per_instance_and_per_node() {
        let reads = Arc::new(LogReads::default());
        let a = InstanceId::new("a");
        let held: Vec<_> = (0..MAX_READS_PER_INSTANCE).map(|_| reads.take(&a).unwrap()).collect();
        let err = reads.take(&a).err().expect("a third read of one instance");
        assert!(err.contains("log reads of a are under way"), "{err}");
        let mut others = Vec::new();
        for i in 0..MAX_READS_PER_NODE - MAX_READS_PER_INSTANCE {
            others.push(reads.take(&InstanceId::new(format!("b{i}"))).unwrap());
        }
        let err = reads.take(&InstanceId::new("c")).err().expect("a read past the node's bound");
        assert!(err.contains("on this agent"), "{err}");
        drop(held);
        assert!(reads.take(&a).is_ok(), "slots come back when reads end");
        drop(others);
        assert!(lock(&reads.0).values().all(|n| *n <= 1));
    }
}
