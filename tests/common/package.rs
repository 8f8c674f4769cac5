//! [`PackageBuilder`]: a component package (`.tar.gz` of `component.toml`
//! and shell scripts) built in memory, the way a user's packaging would:
//! relative entries, parent directories first, file modes kept.

use std::collections::BTreeSet;

/// A package under construction.
#[derive(Debug, Clone)]
pub struct PackageBuilder {
    name: String,
    version: String,
    spec: Option<String>,
    files: Vec<(String, u32, Vec<u8>)>,
}

impl PackageBuilder {
    /// The plainest real package: one role `svc` (1 to 5 instances) whose
    /// start script records its start time and sleeps.
    pub fn sleeper(name: &str) -> Self {
        let spec = format!(
            "[component]\nname = \"{name}\"\nversion = \"1.0.0\"\n\n[[roles]]\nname = \"svc\"\ncount = {{ min = 1, max = 5 }}\nstart = [\"bin/start.sh\"]\nstop_grace = \"2s\"\n"
        );
        PackageBuilder::new(name, "1.0.0").spec(&spec).script("bin/start.sh", super::scripts::RECORD_AND_SLEEP)
    }

    pub fn new(name: &str, version: &str) -> Self {
        PackageBuilder { name: name.into(), version: version.into(), spec: None, files: Vec::new() }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn version(&self) -> &str {
        &self.version
    }

    /// The `component.toml` at the package root (left out when never set).
    pub fn spec(mut self, toml: &str) -> Self {
        self.spec = Some(toml.to_string());
        self
    }

    /// A file at `path` (relative) with `mode`.
    pub fn file(mut self, path: &str, mode: u32, contents: impl AsRef<[u8]>) -> Self {
        self.files.push((path.to_string(), mode, contents.as_ref().to_vec()));
        self
    }

    /// An executable shell script at `path`.
    pub fn script(self, path: &str, body: &str) -> Self {
        self.file(path, 0o755, format!("#!/bin/sh\n{body}"))
    }

    /// The `.tar.gz` bytes.
    pub fn build(&self) -> Vec<u8> {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        let mut tar = tar::Builder::new(gz);
        let mut entries: Vec<(String, u32, Vec<u8>)> = Vec::new();
        if let Some(spec) = &self.spec {
            entries.push(("component.toml".into(), 0o644, spec.clone().into_bytes()));
        }
        entries.extend(self.files.iter().cloned());
        let dirs: BTreeSet<String> = entries
            .iter()
            .flat_map(|(path, _, _)| {
                let parts: Vec<&str> = path.split('/').collect();
                (1..parts.len()).map(move |n| parts[..n].join("/"))
            })
            .collect();
        for dir in dirs {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            h.set_mtime(1_700_000_000);
            tar.append_data(&mut h, format!("{dir}/"), std::io::empty()).expect("tar dir");
        }
        for (path, mode, contents) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(mode);
            h.set_size(contents.len() as u64);
            h.set_mtime(1_700_000_000);
            tar.append_data(&mut h, &path, contents.as_slice()).expect("tar file");
        }
        let gz = tar.into_inner().expect("tar finish");
        gz.finish().expect("gzip finish")
    }
}
