//! `ReadLog`: an installed instance's stdout or stderr log, its last lines
//! or what follows an offset, bounded in bytes. The master polls with the
//! returned offset to follow a log, so the agent keeps no state per reader.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use super::{Node, failure, not_installed};
use crate::ids::InstanceId;
use crate::protocol::messages::{AgentResponse, FailureKind, LogFrom, LogStream};

/// The most one `ReadLog` answers, whatever it asks.
pub const MAX_LOG_CHUNK: u32 = 256 * 1024;

impl Node {
    pub async fn read_log(&self, id: &InstanceId, stream: LogStream, from: LogFrom, max_bytes: u32) -> AgentResponse {
        // Installed is enough (a stopped instance's log is still there); the
        // slot's lock is not taken: reading never races a command's writes
        // beyond seeing a line half written.
        let installed = self.slot(id).record.try_lock().map_or(true, |g| g.is_some());
        if !installed {
            return not_installed(id);
        }
        let name = match stream {
            LogStream::Stdout => "stdout.log",
            LogStream::Stderr => "stderr.log",
        };
        let path = self.instance_dir(id).join("logs").join(name);
        let max = max_bytes.clamp(1, MAX_LOG_CHUNK) as u64;
        match tokio::task::spawn_blocking(move || read(&path, from, max)).await {
            Ok(Ok((data, next_offset))) => AgentResponse::LogChunk { data, next_offset },
            Ok(Err(e)) => failure(FailureKind::BadRequest, format!("reading {name} of {id}: {e}")),
            Err(e) => failure(FailureKind::BadRequest, format!("reading {name} of {id}: {e}")),
        }
    }
}

/// Reads `path` from `from`, at most `max` bytes: (bytes, offset after them).
/// A log that does not exist yet reads as empty.
fn read(path: &Path, from: LogFrom, max: u64) -> std::io::Result<(Vec<u8>, u64)> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(e) => return Err(e),
    };
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

    #[test]
    fn tails_and_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("stdout.log");
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
}
