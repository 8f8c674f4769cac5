//! The `ec2` driver against a real EC2 Query API: PyPI's moto
//! (`moto[server]`, installed by `scripts/setup.sh`) behind a proxy that
//! injects EC2's capacity and quota errors, and a shim that plays the
//! cloud's machines: for each instance moto reports running it runs the
//! instance's own user data (fetched back with
//! `DescribeInstanceAttribute`) in a network namespace of its own, so a
//! real agent downloads itself (a `file://` URL), checks its sha256 and
//! enrolls; a terminated instance's namespace is taken down.
//!
//! Checked as an operator would: a request launches an instance tagged
//! for this installation and pool, which enrolls and takes a cluster
//! placed by the pool's labels; removing the node terminates it; a
//! capacity error moves the request to the next pool, a quota error
//! pauses the pool; a leaked instance (tagged, not in the store) is
//! terminated after two passes, one tagged for another master never is.

use std::collections::{BTreeMap, VecDeque};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::support::*;
use crate::common::{PackageBuilder, TestEnv, id_of, pid_of, role_instances};

const AUTH: &str =
    "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=0";

/// A moto server on loopback; killed on drop.
struct Moto {
    /// `None`: a client of a moto someone else runs.
    child: Option<Child>,
    url: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Moto {
    async fn start() -> Moto {
        let probe = Command::new("python3").args(["-c", "import moto.server"]).output();
        assert!(
            probe.is_ok_and(|o| o.status.success()),
            "moto is missing: run scripts/setup.sh (it installs PyPI's moto[server])"
        );
        let port = free_port();
        let child = Command::new("python3")
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto");
        let moto = Moto { child: Some(child), url: format!("http://127.0.0.1:{port}/") };
        for _ in 0..150 {
            if moto.call("DescribeRegions", &[]).await.is_ok() {
                return moto;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("moto did not answer on port {port} within 15 s");
    }

    async fn call(&self, action: &str, params: &[(&str, &str)]) -> Result<String, String> {
        let mut form: Vec<(&str, &str)> = vec![("Action", action), ("Version", "2016-11-15")];
        form.extend_from_slice(params);
        let body: String = form.iter().map(|(k, v)| format!("{k}={}", urlencode(v))).collect::<Vec<_>>().join("&");
        let resp = reqwest::Client::new()
            .post(&self.url)
            .header("authorization", AUTH)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let ok = resp.status().is_success();
        let text = resp.text().await.map_err(|e| e.to_string())?;
        if ok { Ok(text) } else { Err(text) }
    }

    /// Every instance moto holds: (id, state, tags).
    async fn instances(&self) -> Vec<(String, String, BTreeMap<String, String>)> {
        let xml = self.call("DescribeInstances", &[]).await.expect("DescribeInstances");
        let doc = roxmltree::Document::parse(&xml).expect("xml");
        let mut out = Vec::new();
        for set in doc.descendants().filter(|n| n.has_tag_name("instancesSet")) {
            for i in set.children().filter(|n| n.has_tag_name("item")) {
                let text = |n: roxmltree::Node, name: &str| {
                    n.children().find(|c| c.has_tag_name(name)).and_then(|c| c.text()).unwrap_or("").to_string()
                };
                let state = i.children().find(|c| c.has_tag_name("instanceState")).map(|s| text(s, "name"));
                let tags = i
                    .children()
                    .find(|c| c.has_tag_name("tagSet"))
                    .map(|t| {
                        t.children()
                            .filter(|c| c.has_tag_name("item"))
                            .map(|t| (text(t, "key"), text(t, "value")))
                            .collect()
                    })
                    .unwrap_or_default();
                out.push((text(i, "instanceId"), state.unwrap_or_default(), tags));
            }
        }
        out
    }

    /// Makes an instance tagged `tags` behind the master's back.
    async fn run_tagged(&self, tags: &[(&str, &str)]) -> String {
        let mut p: Vec<(String, String)> = vec![
            ("ImageId".into(), "ami-12c6146b".into()),
            ("InstanceType".into(), "t2.micro".into()),
            ("MinCount".into(), "1".into()),
            ("MaxCount".into(), "1".into()),
            ("TagSpecification.1.ResourceType".into(), "instance".into()),
        ];
        for (i, (k, v)) in tags.iter().enumerate() {
            p.push((format!("TagSpecification.1.Tag.{}.Key", i + 1), k.to_string()));
            p.push((format!("TagSpecification.1.Tag.{}.Value", i + 1), v.to_string()));
        }
        let refs: Vec<(&str, &str)> = p.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let xml = self.call("RunInstances", &refs).await.expect("RunInstances");
        let start = xml.find("<instanceId>").unwrap() + "<instanceId>".len();
        xml[start..start + xml[start..].find('<').unwrap()].to_string()
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Errors to answer instead of moto: (action, EC2 error code), in order.
type Faults = Arc<Mutex<VecDeque<(String, String)>>>;

/// A proxy in front of moto answering the next call of an action with an
/// injected error when one is queued; everything else goes through.
async fn proxy(moto: String) -> (String, Faults) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let faults: Faults = Arc::default();
    let f = faults.clone();
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        while let Ok((mut sock, _)) = listener.accept().await {
            let (client, moto, faults) = (client.clone(), moto.clone(), f.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                let (head_end, length) = loop {
                    let n = sock.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..i]).to_lowercase();
                        let len = head
                            .lines()
                            .find_map(|l| {
                                l.strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        break (i + 4, len);
                    }
                };
                while buf.len() < head_end + length {
                    let n = sock.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                let body = String::from_utf8_lossy(&buf[head_end..head_end + length]).to_string();
                let action = body.split('&').find_map(|p| p.strip_prefix("Action=")).unwrap_or("").to_string();
                let injected = {
                    let mut q = faults.lock().unwrap();
                    match q.front() {
                        Some((a, _)) if *a == action => q.pop_front().map(|(_, code)| code),
                        _ => None,
                    }
                };
                let (status, text) = match injected {
                    Some(code) => (
                        400,
                        format!(
                            "<?xml version=\"1.0\"?><Response><Errors><Error><Code>{code}</Code><Message>injected by the test</Message></Error></Errors><RequestID>t</RequestID></Response>"
                        ),
                    ),
                    None => {
                        let header = |name: &str| {
                            head.lines().find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
                            })
                        };
                        let mut req = client.post(&moto).body(body);
                        for h in ["authorization", "content-type", "x-amz-date"] {
                            if let Some(v) = header(h) {
                                req = req.header(h, v);
                            }
                        }
                        match req.send().await {
                            Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
                            Err(e) => (502, e.to_string()),
                        }
                    }
                };
                let answer = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: text/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                    text.len()
                );
                let _ = sock.write_all(answer.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    (url, faults)
}

/// The machines: each running instance's user data run in a namespace of
/// its own (`<prefix>-<k>-ec2`, reaching the master at `<net>.1` on the
/// host's loopback), taken down once moto says it is terminated. Until dropped.
struct Machines {
    /// The master's address on the loopback link, removed on drop.
    dummy: String,
    master_ip: String,
    stop: Arc<std::sync::atomic::AtomicBool>,
    log: Arc<Mutex<Vec<String>>>,
    shim: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Machines {
    /// The shim stopped first (it boots no machine after this), then the
    /// master's address taken off the loopback.
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.shim.take() {
            let _ = t.join();
        }
        let _ = Command::new("ip").args(["addr", "del", &self.dummy, "dev", "lo"]).output();
    }
}

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().expect("run");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl Machines {
    fn start(space: &Space, moto: String, dir: std::path::PathBuf) -> Machines {
        let net = space.network.trim_end_matches(".0/24").to_string();
        // The master's address for the machines, on the host's loopback
        // (no dummy links in every kernel).
        let master_ip = format!("{net}.1");
        let dummy = format!("{master_ip}/32");
        let _ = Command::new("ip").args(["addr", "del", &dummy, "dev", "lo"]).output();
        sh(&["ip", "addr", "add", &dummy, "dev", "lo"]);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (s, l, prefix) = (stop.clone(), log.clone(), space.prefix.clone());
        let shim = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let moto = Moto { child: None, url: moto };
                let mut up: BTreeMap<String, String> = BTreeMap::new();
                let mut k = 0u32;
                while !s.load(std::sync::atomic::Ordering::SeqCst) {
                    for (id, state, _) in moto.instances().await {
                        match state.as_str() {
                            "running" if !up.contains_key(&id) => {
                                k += 1;
                                let ns = format!("{prefix}-{k}-ec2");
                                let said = boot(&moto, &id, &ns, &net, k, &dir).await;
                                l.lock().unwrap().push(format!("{id} in {ns}: {said}"));
                                up.insert(id, ns);
                            }
                            "shutting-down" | "terminated" if up.contains_key(&id) => {
                                let ns = up.remove(&id).unwrap();
                                take_down(&ns);
                                l.lock().unwrap().push(format!("{id} in {ns}: terminated"));
                            }
                            _ => {}
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            });
        });
        Machines { dummy, master_ip, stop, log, shim: Some(shim) }
    }
}

/// Boots instance `id`: its namespace, then its user data as root in it.
async fn boot(moto: &Moto, id: &str, ns: &str, net: &str, k: u32, dir: &std::path::Path) -> String {
    let xml = match moto.call("DescribeInstanceAttribute", &[("InstanceId", id), ("Attribute", "userData")]).await {
        Ok(x) => x,
        Err(e) => return format!("no user data: {e}"),
    };
    let Some(b64) = xml.split("<value>").nth(1).and_then(|v| v.split('<').next()) else {
        return "no user data".into();
    };
    let Ok(script) = base64::engine::general_purpose::STANDARD.decode(b64.trim()) else { return "bad base64".into() };
    let file = dir.join(format!("{id}.sh"));
    std::fs::write(&file, script).unwrap();
    let (host, inside) = (format!("{net}.{}", 4 * k + 1), format!("{net}.{}", 4 * k + 2));
    let (vh, vn) = (format!("{}h{k}", &ns[..ns.find('-').unwrap()]), format!("{}n{k}", &ns[..ns.find('-').unwrap()]));
    for args in [
        vec!["ip", "netns", "add", ns],
        vec!["ip", "link", "add", &vh, "type", "veth", "peer", "name", &vn],
        vec!["ip", "link", "set", &vn, "netns", ns],
        vec!["ip", "addr", "add", &format!("{host}/30"), "dev", &vh],
        vec!["ip", "link", "set", &vh, "up"],
        vec!["ip", "-n", ns, "addr", "add", &format!("{inside}/30"), "dev", &vn],
        vec!["ip", "-n", ns, "link", "set", &vn, "up"],
        vec!["ip", "-n", ns, "link", "set", "lo", "up"],
        vec!["ip", "-n", ns, "route", "add", "default", "via", &host],
    ] {
        let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
        if !out.status.success() {
            return format!("{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    // In a mount namespace of its own with an empty /run/systemd: on a
    // host run by systemd, the script's systemd branch must not install a
    // unit on the host.
    let run = format!(
        "mount -t tmpfs tmpfs /run/systemd 2>/dev/null; exec nsenter --net=/run/netns/{ns} sh {}",
        file.display()
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &run])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    format!("user data exit {:?}: {}", out.status.code(), String::from_utf8_lossy(&out.stderr).trim())
}

/// A terminated machine: everything in its namespace killed, then it.
fn take_down(ns: &str) {
    if let Ok(m) = std::fs::metadata(format!("/run/netns/{ns}")) {
        let inode = std::os::unix::fs::MetadataExt::ino(&m);
        for pid in pids_in(inode) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
    let _ = Command::new("ip").args(["netns", "del", ns]).output();
}

/// Request `id` once fulfilled (what the machines did, if it is not).
async fn fulfilled(env: &TestEnv, id: &str, machines: &Machines) -> serde_json::Value {
    env.until(90, "the request fulfilled", async || {
        let r = request_of(env, id).await;
        if r["state"] == "fulfilled" {
            Ok(r)
        } else {
            Err(format!("{r}\nmachines: {:?}", machines.log.lock().unwrap()))
        }
    })
    .await
}

/// An `ec2` pool on `endpoint`.
fn ec2_pool(name: &str, endpoint: &str, master_ip: &str, agent_dir: &str, extra: &str) -> String {
    format!(
        "[[node_pools]]\nname = \"{name}\"\ndriver = \"ec2\"\nlabels = {{ cloud = \"ec2\" }}\nmax_nodes = 2\nlaunch_retries = 0\n{extra}\n\
         [node_pools.settings]\nregion = \"us-east-1\"\nendpoint = \"{endpoint}\"\nimage_id = \"ami-12c6146b\"\n\
         instance_type = \"t2.micro\"\nagent_url = \"file://{}\"\nmaster_host = \"{master_ip}\"\nagent_dir = \"{agent_dir}\"\n",
        env!("CARGO_BIN_EXE_flotilla")
    )
}

/// A directory every instance user can pass through (0711), removed on drop.
fn open_dir(name: &str) -> tempfile::TempDir {
    let d = tempfile::Builder::new().prefix(name).tempdir_in("/tmp").unwrap();
    std::fs::set_permissions(d.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
    d
}

fn env_with_aws() -> Vec<(&'static str, &'static str)> {
    let mut v: Vec<(&str, &str)> = FAST.to_vec();
    v.extend([("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")]);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ec2_pool_launches_instances_that_enroll_take_a_cluster_are_terminated_on_removal_and_leaks_go() {
    let moto = Moto::start().await;
    let space = Space::new();
    let dir = open_dir("flotilla-ec2-");
    let machines = Machines::start(&space, moto.url.clone(), dir.path().to_path_buf());
    let agents = dir.path().join("nodes");
    let config = ec2_pool("e", &moto.url, &machines.master_ip, agents.to_str().unwrap(), "");
    let env = TestEnv::start_with_config("pools-ec2", &env_with_aws(), &config, 0).await;
    // Dropped in this order: the shim, the machines' namespaces, the master.
    let _space = space;
    let machines = machines;
    let id = request(&env, json!({"cloud": "ec2"}), 1).await;
    let done = fulfilled(&env, &id, &machines).await;
    let node = done["nodes"][0].as_str().unwrap().to_string();
    let (_, n) = env.get(&format!("/nodes/{node}")).await;
    let instance = n["origin"]["external_id"].as_str().unwrap().to_string();
    assert!(instance.starts_with("i-"), "{n:#}");
    assert_eq!((n["status"].as_str(), n["labels"]["cloud"].as_str()), (Some("Ready"), Some("ec2")), "{n:#}");
    // Tagged for this installation, its pool and its node.
    let (_, p) = env.get("/pools").await;
    let install = p["pools"][0]["tags"]["flotilla-master"].as_str().unwrap().to_string();
    let all = moto.instances().await;
    let (_, state, tags) = all.iter().find(|(i, _, _)| *i == instance).expect("the instance in moto");
    assert_eq!(state, "running");
    for (k, v) in
        [("flotilla-master", install.as_str()), ("flotilla-pool", "e"), ("flotilla-node", &node), ("Name", &node)]
    {
        assert_eq!(tags.get(k).map(String::as_str), Some(v), "tag {k}: {tags:?}");
    }
    // The agent runs in the machine's namespace, with no token on its command line.
    let ns = machines.log.lock().unwrap().iter().find(|l| l.starts_with(&instance)).cloned().unwrap();
    let ns = ns.split(" in ").nth(1).unwrap().split(':').next().unwrap().to_string();
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(format!("/run/netns/{ns}")).unwrap());
    let agent = pids_in(inode)
        .into_iter()
        .find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains("\0agent\0"))
        })
        .expect("an agent in the machine");
    let cmdline = String::from_utf8_lossy(&std::fs::read(format!("/proc/{agent}/cmdline")).unwrap()).replace('\0', " ");
    assert!(cmdline.contains(&format!("--node-id {node}")) && !cmdline.contains("flj_"), "{cmdline}");

    // A cluster placed by the pool's label lands there and runs in the machine.
    env.upload(&PackageBuilder::sleeper("oncloud")).await;
    let c = env
        .create_active(json!({"name": "c", "package": {"name": "oncloud", "version": "1.0.0"},
            "roles": {"svc": {"count": 1, "node_labels": {"cloud": "ec2"}}}}))
        .await;
    let svc = role_instances(&c, "svc");
    assert_eq!(svc[0]["node"], node.as_str(), "{c:#}");
    assert!(pids_in(inode).contains(&(pid_of(&svc[0]) as i32)), "{} runs in {ns}", id_of(&svc[0]));
    let (status, v) = env.delete("/clusters/c").await;
    assert_eq!(status.as_u16(), 202, "{v:#}");
    env.wait_op(v["operation"]["id"].as_str().unwrap()).await;

    // Leaks: one tagged for this installation and pool is terminated after
    // two passes and the grace; one of another installation never.
    let leaked =
        moto.run_tagged(&[("flotilla-master", &install), ("flotilla-pool", "e"), ("flotilla-node", "e-gone")]).await;
    let theirs = moto.run_tagged(&[("flotilla-master", "feedfacefeedface"), ("flotilla-pool", "e")]).await;
    env.until(30, "the leaked instance terminated", async || {
        let all = moto.instances().await;
        let s = all.iter().find(|(i, _, _)| *i == leaked).map(|(_, s, _)| s.clone()).unwrap_or_default();
        if s == "terminated" || s == "shutting-down" { Ok(()) } else { Err(s) }
    })
    .await;
    let all = moto.instances().await;
    let s = all.iter().find(|(i, _, _)| *i == theirs).map(|(_, s, _)| s.clone());
    assert_eq!(s.as_deref(), Some("running"), "another installation's instance is never touched");

    // Removing the node terminates its instance; the machine goes.
    let (status, v) = env.post_empty(&format!("/nodes/{node}/remove")).await;
    assert_eq!(status.as_u16(), 202, "{v:#}");
    env.until(60, "the node gone and its instance terminated", async || {
        let (status, _) = env.get(&format!("/nodes/{node}")).await;
        let all = moto.instances().await;
        let s = all.iter().find(|(i, _, _)| *i == instance).map(|(_, s, _)| s.clone()).unwrap_or_default();
        if status == 404 && (s == "terminated" || s == "shutting-down") { Ok(()) } else { Err(format!("{status} {s}")) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capacity_error_moves_the_request_to_the_next_ec2_pool_and_a_quota_error_pauses_a_pool() {
    let moto = Moto::start().await;
    let (endpoint, faults) = proxy(moto.url.clone()).await;
    let space = Space::new();
    let dir = open_dir("flotilla-ec2-");
    let machines = Machines::start(&space, moto.url.clone(), dir.path().to_path_buf());
    let agents = dir.path().join("nodes");
    let agents = agents.to_str().unwrap();
    let config = format!(
        "{}{}",
        ec2_pool("first", &endpoint, &machines.master_ip, agents, "priority = 1"),
        ec2_pool("second", &endpoint, &machines.master_ip, agents, "priority = 2")
    );
    let env = TestEnv::start_with_config("pools-ec2-faults", &env_with_aws(), &config, 0).await;
    // Dropped in this order: the shim, the machines' namespaces, the master.
    let _space = space;
    let machines = machines;
    // The first pool's RunInstances: no capacity. The request moves on.
    faults.lock().unwrap().push_back(("RunInstances".into(), "InsufficientInstanceCapacity".into()));
    let id = request(&env, json!({"cloud": "ec2"}), 1).await;
    let done = fulfilled(&env, &id, &machines).await;
    assert_eq!(done["pool"], "second", "{done:#}");
    assert_eq!(done["declined_by"], json!(["first"]), "{done:#}");
    assert!(done["reasons"][0].as_str().unwrap().contains("InsufficientInstanceCapacity"), "{done:#}");
    assert!(done["reasons"][0].as_str().unwrap().contains("capacity error"), "{done:#}");
    let first = pool_of(&env, "first").await;
    assert_eq!(first["health"], "no_capacity", "{first:#}");
    assert!(
        first["health_detail"]["last_error"].as_str().unwrap_or("").contains("InsufficientInstanceCapacity"),
        "{first:#}"
    );

    // The second pool's next RunInstances: over the account's limit. The
    // pool pauses; the request waits (the first still has no capacity).
    faults.lock().unwrap().push_back(("RunInstances".into(), "InstanceLimitExceeded".into()));
    let waiting = request(&env, json!({"cloud": "ec2"}), 1).await;
    env.until(30, "the second pool paused", async || {
        let p = pool_of(&env, "second").await;
        if p["health"] == "paused" { Ok(()) } else { Err(p.to_string()) }
    })
    .await;
    let r = request_of(&env, &waiting).await;
    assert!(["requested", "pending"].contains(&r["state"].as_str().unwrap()), "at quota it waits: {r:#}");
    assert!(faults.lock().unwrap().is_empty(), "both injected errors were answered");
}
