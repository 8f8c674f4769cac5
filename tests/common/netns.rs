//! [`Netns`]: a network namespace the test makes, joined to this one by
//! veth pairs (a /30 each: the host end `.1`, the namespace end `.2`),
//! deleted with its pairs when dropped. A link is cut by setting its host
//! end down: every packet either way is lost, and neither end gets a RST
//! or a FIN, as with a cut cable or a dead switch; the heal sets it up
//! again.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Chromium fails a page's requests with `ERR_NETWORK_CHANGED` when a
/// network interface or address comes or goes under it: tests that add or
/// remove them (namespaces, veth pairs, addresses; a local pool's
/// launches) hold this shared, a test driving Chromium holds it alone.
/// Shared holders never wait for a waiting browser (one test may hold it
/// twice): `(shared holders, browsing)`.
static INTERFACES: Mutex<(usize, bool)> = Mutex::new((0, false));
static CHANGED: Condvar = Condvar::new();

/// Held while a test may add or remove network interfaces.
pub struct Changing(());

/// Held while a test drives Chromium.
pub struct Browsing(());

fn state() -> std::sync::MutexGuard<'static, (usize, bool)> {
    INTERFACES.lock().unwrap_or_else(|p| p.into_inner())
}

fn wait(g: std::sync::MutexGuard<'static, (usize, bool)>) -> std::sync::MutexGuard<'static, (usize, bool)> {
    CHANGED.wait(g).unwrap_or_else(|p| p.into_inner())
}

/// Waits until no test drives Chromium, then holds interfaces changing.
pub fn changing_interfaces() -> Changing {
    let mut g = state();
    while g.1 {
        g = wait(g);
    }
    g.0 += 1;
    Changing(())
}

impl Drop for Changing {
    fn drop(&mut self) {
        state().0 -= 1;
        CHANGED.notify_all();
    }
}

/// Waits until no test changes interfaces or browses, then browses.
pub fn browsing() -> Browsing {
    let mut g = state();
    while g.0 > 0 || g.1 {
        g = wait(g);
    }
    g.1 = true;
    Browsing(())
}

impl Drop for Browsing {
    fn drop(&mut self) {
        state().1 = false;
        CHANGED.notify_all();
    }
}

/// Runs `ip ARGS`, panicking with the reason when it fails.
pub fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip").args(args).output().unwrap_or_else(|e| {
        panic!("cannot run `ip {}` (iproute2, installed by scripts/setup.sh): {e}", args.join(" "))
    });
    assert!(
        out.status.success(),
        "`ip {}` failed (the test needs root and network namespaces): {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One veth pair between the host and the namespace.
pub struct Link {
    pub host_if: String,
    pub host_ip: String,
    pub ns_ip: String,
}

pub struct Netns {
    pub name: String,
    tag: String,
    /// 10.A.B: this namespace's /24, cut into a /30 per link.
    net: String,
    pub links: Vec<Link>,
    /// Addresses added to the host's loopback for the namespace to reach.
    host_addrs: Vec<String>,
    _changing: Changing,
}

impl Netns {
    /// A namespace with one link (`host_ip`/`ns_ip`), loopback up.
    pub fn make() -> Netns {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let tag = format!("{}{n}", pid % 100_000);
        // 10.200-229 (pools' Spaces use 10.232-239, dev's pools 10.245-246,
        // the HA partition test's host addresses 10.250).
        let (a, b) = (200 + pid % 30, (pid / 30 % 60) * 4 + n);
        let mut ns = Netns {
            name: format!("flt-part-{tag}"),
            tag,
            net: format!("10.{a}.{b}"),
            links: Vec::new(),
            host_addrs: Vec::new(),
            _changing: changing_interfaces(),
        };
        ip(&["netns", "add", &ns.name]);
        ip(&["netns", "exec", &ns.name, "ip", "link", "set", "lo", "up"]);
        ns.link();
        ns
    }

    /// Adds a link (the k-th: host `10.A.B.4k+1`, namespace `.4k+2`).
    pub fn link(&mut self) -> &Link {
        let k = self.links.len();
        assert!(k < 60, "too many links");
        let link = Link {
            host_if: format!("fph{}{}", self.tag, if k == 0 { String::new() } else { format!("x{k}") }),
            host_ip: format!("{}.{}", self.net, 4 * k + 1),
            ns_ip: format!("{}.{}", self.net, 4 * k + 2),
        };
        let peer = format!("fpn{}{}", self.tag, if k == 0 { String::new() } else { format!("x{k}") });
        ip(&["link", "add", &link.host_if, "type", "veth", "peer", "name", &peer]);
        // Deleted with the namespace from here on, whatever fails next.
        self.links.push(link);
        let link = &self.links[k];
        ip(&["link", "set", &peer, "netns", &self.name]);
        ip(&["addr", "add", &format!("{}/30", link.host_ip), "dev", &link.host_if]);
        ip(&["link", "set", &link.host_if, "up"]);
        ip(&["netns", "exec", &self.name, "ip", "addr", "add", &format!("{}/30", link.ns_ip), "dev", &peer]);
        ip(&["netns", "exec", &self.name, "ip", "link", "set", &peer, "up"]);
        link
    }

    /// The first link's host end.
    pub fn host_ip(&self) -> &str {
        &self.links[0].host_ip
    }

    /// The first link's namespace end.
    pub fn ns_ip(&self) -> &str {
        &self.links[0].ns_ip
    }

    /// Every packet of link `k` is lost from now.
    pub fn cut_link(&self, k: usize) {
        ip(&["link", "set", &self.links[k].host_if, "down"]);
    }

    pub fn heal_link(&self, k: usize) {
        ip(&["link", "set", &self.links[k].host_if, "up"]);
    }

    /// Cuts the first link.
    pub fn cut(&self) {
        self.cut_link(0);
    }

    pub fn heal(&self) {
        self.heal_link(0);
    }

    /// Adds `addr` to the host's loopback (removed when dropped) and routes
    /// the namespace's traffic for it through the first link.
    pub fn reach_host_addr(&mut self, addr: &str) {
        // One a killed run of the same test left behind goes first.
        let _ = std::process::Command::new("ip").args(["addr", "del", &format!("{addr}/32"), "dev", "lo"]).output();
        ip(&["addr", "add", &format!("{addr}/32"), "dev", "lo"]);
        self.host_addrs.push(addr.to_string());
        let via = self.links[0].host_ip.clone();
        ip(&["netns", "exec", &self.name, "ip", "route", "add", &format!("{addr}/32"), "via", &via]);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let run = |args: &[&str]| {
            let _ = std::process::Command::new("ip").args(args).output();
        };
        for l in &self.links {
            run(&["link", "del", &l.host_if]);
        }
        for a in &self.host_addrs {
            run(&["addr", "del", &format!("{a}/32"), "dev", "lo"]);
        }
        run(&["netns", "del", &self.name]);
    }
}
