//! Tests of `config.rs`.

use super::*;

fn env(pairs: &[(&str, &str)]) -> Option<config::Map<String, String>> {
    Some(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

#[test]
fn defaults_are_valid_and_env_overrides() {
    let cfg = MasterConfig::load_with_env(None, env(&[("FLOTILLA_MASTER_HTTP_ADDR", "127.0.0.1:9999")]), &[]).unwrap();
    assert_eq!(cfg.http_addr, "127.0.0.1:9999");
    assert_eq!(cfg.heartbeat_interval, Duration::from_secs(2));
}

#[test]
fn shipped_config_files_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    MasterConfig::load_with_env(Some(&dir.join("master.toml")), env(&[]), &[]).unwrap();
    AgentConfig::load_with_env(Some(&dir.join("agent.toml")), env(&[]), &[("node_id", "n1".into())]).unwrap();
}

#[test]
fn agent_labels_come_from_flags_over_the_file_and_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("a.toml");
    std::fs::write(&f, "node_id = \"n1\"\n[labels]\nzone = \"a\"\nclass = \"small\"\n").unwrap();
    let cfg = AgentConfig::load_with_env(Some(&f), env(&[]), &[("labels.class", "big".into())]).unwrap();
    let want: BTreeMap<String, String> = [("class".into(), "big".into()), ("zone".into(), "a".into())].into();
    assert_eq!(cfg.labels, want);
    let n1 = [("node_id", "n1".to_string())];
    for (key, value, word) in
        [("labels.class", "B g", "\"class\": invalid label value"), ("labels.x_y", "v", "\"x_y\": invalid label name")]
    {
        let o = [n1[0].clone(), (key, value.to_string())];
        let err = AgentConfig::load_with_env(None, env(&[]), &o).unwrap_err().to_string();
        assert!(err.contains("labels") && err.contains(word), "{key}={value}: {err}");
    }
}

#[test]
fn unknown_key_and_bad_value_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("m.toml");
    std::fs::write(&f, "htp_addr = \"x\"\n").unwrap();
    let err = MasterConfig::load_with_env(Some(&f), env(&[]), &[]).unwrap_err().to_string();
    assert!(err.contains("htp_addr"), "{err}");

    let err =
        MasterConfig::load_with_env(None, env(&[("FLOTILLA_MASTER_HTTP_ADDR", "nope")]), &[]).unwrap_err().to_string();
    assert!(err.contains("http_addr"), "{err}");

    let err = MasterConfig::load_with_env(None, env(&[("FLOTILLA_MASTER_HEARTBEAT_INTERVAL", "soon")]), &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("soon"), "{err}");

    // Thread counts: 0 picks from the CPUs; past 256 is refused by name.
    let err = MasterConfig::load_with_env(None, env(&[("FLOTILLA_MASTER_LINK_THREADS", "257")]), &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("link_threads") && err.contains("257 is outside 0..=256"), "{err}");
    let cfg = MasterConfig::load_with_env(None, env(&[("FLOTILLA_MASTER_LINK_THREADS", "3")]), &[]).unwrap();
    assert_eq!(cfg.link_threads, 3);

    // The listener's first-bytes deadline sits inside the handshake's.
    let err = MasterConfig::load_with_env(None, env(&[("FLOTILLA_MASTER_FIRST_BYTES_TIMEOUT", "11s")]), &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("first_bytes_timeout") && err.contains("handshake_timeout"), "{err}");
    let err = MasterConfig::load_with_env(None, env(&[("FLOTILLA_MASTER_MAX_AGENT_HANDSHAKES_PER_SUBNET", "0")]), &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_agent_handshakes_per_subnet"), "{err}");
    let cfg =
        MasterConfig::load_with_env(None, env(&[("FLOTILLA_MASTER_RESERVED_AGENT_HANDSHAKES", "0")]), &[]).unwrap();
    assert_eq!(cfg.reserved_agent_handshakes, 0, "no room kept is allowed");
}

#[test]
fn agent_needs_node_id_and_a_sane_port_range() {
    let err = AgentConfig::load_with_env(None, env(&[]), &[]).unwrap_err().to_string();
    assert!(err.contains("node_id"), "{err}");
    let err =
        AgentConfig::load_with_env(None, env(&[]), &[("node_id", "n1".into()), ("port_range", "30000-20000".into())])
            .unwrap_err()
            .to_string();
    assert!(err.contains("port_range"), "{err}");
    let ok = AgentConfig::load_with_env(None, env(&[]), &[("node_id", "n1".into())]).unwrap();
    assert_eq!(ok.ports().unwrap(), (20000, 29999));
}

#[test]
fn agent_run_as_and_loader_env_rules_load_from_file_and_env() {
    let n1 = [("node_id", "n1".to_string())];
    let ok = AgentConfig::load_with_env(None, env(&[]), &n1).unwrap();
    assert!(ok.allowed_run_as.is_empty() && !ok.allow_loader_env && !ok.allow_root);

    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("a.toml");
    std::fs::write(&f, "allowed_run_as = [\"app\", \"web\"]\nallow_loader_env = true\n").unwrap();
    let cfg = AgentConfig::load_with_env(Some(&f), env(&[]), &n1).unwrap();
    assert_eq!(cfg.allowed_run_as, ["app", "web"]);
    assert!(cfg.allow_loader_env);

    let cfg = AgentConfig::load_with_env(None, env(&[("FLOTILLA_AGENT_ALLOWED_RUN_AS", "app,db")]), &n1).unwrap();
    assert_eq!(cfg.allowed_run_as, ["app", "db"]);
    let err = AgentConfig::load_with_env(None, env(&[("FLOTILLA_AGENT_ALLOWED_RUN_AS", "app,")]), &n1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("allowed_run_as"), "{err}");
}
