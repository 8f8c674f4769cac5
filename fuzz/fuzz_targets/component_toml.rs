//! Any text as `component.toml`: parsed and validated, or refused with a
//! typed error; every role's templates of a spec that parses are rendered
//! (an error or files, bounded by the renderer's fuel); never a panic.
#![no_main]

use std::collections::BTreeMap;

use flotilla::spec::ComponentSpec;
use flotilla::spec::render::{ClusterCtx, ComponentCtx, InstanceCtx, RenderContext, render_env, render_files};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(spec) = ComponentSpec::parse(text) else { return };
    for role in &spec.roles {
        let ctx = RenderContext {
            component: ComponentCtx { name: spec.component.name.clone(), version: spec.component.version.clone() },
            cluster: ClusterCtx { name: "c".into(), id: "id".into(), config: BTreeMap::new(), roles: BTreeMap::new() },
            instance: InstanceCtx {
                id: format!("c-{}-1-abcdef", role.name),
                ordinal: 1,
                role: role.name.clone(),
                host: "127.0.0.1".into(),
                node: "n1".into(),
                ports: BTreeMap::new(),
                dir: "/i".into(),
                data_dir: "/i/data".into(),
            },
        };
        let _ = render_files(role, &ctx);
        let _ = render_env(role, &ctx);
    }
});
