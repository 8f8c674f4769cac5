//! The machine's ceilings, measured in the same run as the figures they
//! judge (the machine is shared and noisy): how many synced writes one
//! writer gets per second in the master's data dir, and how many processes
//! can be spawned and waited for per second.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// 4 KiB written at offset 0 and `fdatasync`ed, repeatedly, for `dur`:
/// syncs per second. One writer, as the master's store has one.
pub fn fdatasync_per_s(dir: &Path, dur: Duration) -> std::io::Result<f64> {
    let path = dir.join(".fdatasync-probe");
    let mut f = std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path)?;
    f.write_all(&[0u8; 4096])?;
    f.sync_all()?;
    let buf = [7u8; 4096];
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < dur {
        f.write_all_at(&buf, 0)?;
        f.sync_data()?;
        n += 1;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    drop(f);
    let _ = std::fs::remove_file(&path);
    Ok(rate)
}

/// `/bin/true` spawned (fork + exec) and waited for, repeatedly, for
/// `dur`: processes per second.
pub fn spawn_per_s(dur: Duration) -> std::io::Result<f64> {
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < dur {
        std::process::Command::new("/bin/true").status()?;
        n += 1;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// A process's resident memory (MiB) and CPU time (seconds), from `/proc`.
pub fn proc_usage(pid: u32) -> Option<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may contain spaces) start at ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    Some((rss_kb / 1024.0, (utime + stime) / ticks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_are_positive_and_usage_reads_our_own_process() {
        let dir = tempfile::tempdir().unwrap();
        assert!(fdatasync_per_s(dir.path(), Duration::from_millis(50)).unwrap() > 0.0);
        assert!(spawn_per_s(Duration::from_millis(50)).unwrap() > 0.0);
        let (rss, cpu) = proc_usage(std::process::id()).unwrap();
        assert!(rss > 1.0, "{rss} MiB");
        assert!(cpu >= 0.0);
    }
}
