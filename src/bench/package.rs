//! The package `flotilla bench` deploys: one role `d` with one port, a
//! rendered config file and a daemonizing start script that forks a
//! `sleep` and writes a pidfile (real agents run it; simulated ones only
//! pretend to).

/// The package's name and version.
pub const NAME: &str = "bench";
pub const VERSION: &str = "1.0.0";

/// `component.toml`; `max` is the role's `count.max`.
pub fn spec(max: u32) -> String {
    format!(
        r#"[component]
name = "{NAME}"
version = "{VERSION}"

[config]
greeting = {{ type = "string", default = "hello" }}

[[roles]]
name = "d"
count = {{ min = 1, max = {max} }}
ports = ["main"]
start = ["bin/run.sh"]
pidfile = "run/d.pid"
stop_grace = "2s"
start_timeout = "20s"

[[roles.files]]
path = "conf/d.conf"
template = """port={{{{ instance.ports.main }}}}
greeting={{{{ cluster.config.greeting }}}}
"""
"#
    )
}

/// Forks a long sleep, records its pid, exits.
pub const RUN: &str = "#!/bin/sh\nsleep 1000000 >/dev/null 2>&1 &\necho $! > run/d.pid\n";

/// The package as a `.tar.gz`.
pub fn tarball(max: u32) -> std::io::Result<Vec<u8>> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (path, body, mode) in [("component.toml", spec(max), 0o644), ("bin/run.sh", RUN.to_string(), 0o755)] {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(mode);
        h.set_mtime(0);
        h.set_cksum();
        tar.append_data(&mut h, path, body.as_bytes())?;
    }
    tar.into_inner()?.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bench_spec_is_valid() {
        let spec = crate::spec::ComponentSpec::parse(&spec(5000)).unwrap();
        assert_eq!(spec.roles[0].count.max, 5000);
        assert!(!tarball(10).unwrap().is_empty());
    }
}
