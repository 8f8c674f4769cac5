//! Process identity from `/proc`: pid + start time + boot id, so a recycled
//! pid is never mistaken for (and never signalled as) the process the agent
//! started. Also the small `/proc/<pid>/stat` parser the tree scan uses.

use std::io;

use crate::storage::agent_records::PidIdentity;

const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The kernel's boot id (changes on every boot, so never while this
/// process runs: read once, then answered from memory; `is_alive` asks it
/// for every check of every instance).
pub fn boot_id() -> io::Result<String> {
    static CACHED: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    if let Some(id) = CACHED.get() {
        return Ok(id.clone());
    }
    let id = std::fs::read_to_string(BOOT_ID)?.trim().to_string();
    Ok(CACHED.get_or_init(|| id).clone())
}

/// The fields of `/proc/<pid>/stat` the agent needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    /// Field 3: `R`, `S`, `D`, `Z`, `X`, ...
    pub state: char,
    /// Field 5.
    pub pgid: i32,
    /// Field 22: clock ticks after boot.
    pub start_time: u64,
}

impl Stat {
    /// A zombie or dead task is not running any more.
    pub fn is_running(&self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Parses the text of `/proc/<pid>/stat`. The command name (field 2) is in
/// parentheses and may itself contain spaces and `)`, so fields are counted
/// after the LAST `)`.
pub(crate) fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 of the man page.
    let state = fields.first()?.chars().next()?;
    let pgid = fields.get(2)?.parse().ok()?;
    let start_time = fields.get(19)?.parse().ok()?;
    Some(Stat { state, pgid, start_time })
}

pub(crate) fn read_stat(pid: u32) -> Option<Stat> {
    use std::io::Read;
    // Sized for the usual line (`fs::read_to_string` starts at 32 bytes for
    // a procfs file, which reports no size: five reads instead of two). Not
    // UTF-8-checked: a process may name itself with any bytes (or the
    // kernel may cut a name mid-character), and must not hide that way.
    let mut buf = Vec::with_capacity(512);
    std::fs::File::open(format!("/proc/{pid}/stat")).ok()?.read_to_end(&mut buf).ok()?;
    parse_stat(&String::from_utf8_lossy(&buf))
}

/// The identity of the live process `pid`, or `None` when there is none.
pub fn read_identity(pid: u32) -> Option<PidIdentity> {
    let boot_id = boot_id().ok()?;
    let stat = read_stat(pid)?;
    Some(PidIdentity { pid, start_time: stat.start_time, boot_id })
}

/// True when the very process `id` describes still runs: same boot, the pid
/// exists with the same start time, and it is not a zombie.
pub fn is_alive(id: &PidIdentity) -> bool {
    match boot_id() {
        Ok(b) if b == id.boot_id => {}
        _ => return false,
    }
    matches_stat(id.pid, id.start_time)
}

/// True when `pid` runs and started at `start_time` (the boot is assumed).
pub(crate) fn matches_stat(pid: u32, start_time: u64) -> bool {
    match read_stat(pid) {
        Some(s) => s.start_time == start_time && s.is_running(),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_parens_and_spaces_in_comm() {
        let line =
            "1234 (a) b (c)) S 1 77 77 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615";
        let s = parse_stat(line).unwrap();
        assert_eq!(s, Stat { state: 'S', pgid: 77, start_time: 987654 });
        assert!(parse_stat("garbage").is_none());
        assert!(parse_stat("1 (x) S 1").is_none());
    }

    #[test]
    fn a_process_named_with_invalid_utf8_is_still_seen() {
        // A process may give itself any bytes as its name (here a shell,
        // which then waits on its stdin).
        let mut child = std::process::Command::new("sh")
            .args(["-c", r#"printf '\377\376)x (y' > /proc/self/comm; read x"#])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !std::fs::read(format!("/proc/{pid}/comm")).unwrap().starts_with(b"\xff\xfe") {
            assert!(std::time::Instant::now() < deadline, "the shell did not rename itself");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let stat = read_stat(pid);
        let snap = super::super::scan::Snapshot::take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(stat.is_some_and(|s| s.is_running()), "read_stat lost a process with a non-UTF-8 name");
        assert!(snap.procs.contains_key(&pid), "the /proc pass lost a process with a non-UTF-8 name");
    }

    #[test]
    fn own_process_is_alive_and_a_wrong_start_time_is_not() {
        let me = read_identity(std::process::id()).unwrap();
        assert!(is_alive(&me));
        assert_eq!(me.boot_id, boot_id().unwrap());
        let recycled = PidIdentity { start_time: me.start_time + 1, ..me.clone() };
        assert!(!is_alive(&recycled));
        let other_boot = PidIdentity { boot_id: "not-this-boot".into(), ..me };
        assert!(!is_alive(&other_boot));
    }

    #[test]
    fn start_time_matches_procfs_field_22() {
        let text = std::fs::read_to_string("/proc/self/stat").unwrap();
        let after = &text[text.rfind(')').unwrap() + 2..];
        let field22: u64 = after.split(' ').nth(19).unwrap().parse().unwrap();
        assert_eq!(parse_stat(&text).unwrap().start_time, field22);
    }
}
