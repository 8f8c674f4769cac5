//! Any bytes as the JSON body of the admin API's mutations: a body or a
//! refusal, never a panic. A create body that parses goes on through the
//! validation the master runs before anything exists (the name rule, each
//! role's count against the package, the config typed and bounded by a
//! real `component.toml`), which must answer a value or a typed error.
#![no_main]

use flotilla::http::dto::{ConfigBody, CreateClusterBody, CreateJoinTokenBody, ResizeBody, ScaleBody, UpgradeBody};
use flotilla::spec::ComponentSpec;
use libfuzzer_sys::fuzz_target;

const SPEC: &str = include_str!("../../examples/components/zookeeper/component.toml");

fn spec() -> &'static ComponentSpec {
    static SPEC_PARSED: std::sync::OnceLock<ComponentSpec> = std::sync::OnceLock::new();
    SPEC_PARSED.get_or_init(|| ComponentSpec::parse(SPEC).expect("the example spec parses"))
}

fuzz_target!(|data: &[u8]| {
    let _ = serde_json::from_slice::<ScaleBody>(data);
    let _ = serde_json::from_slice::<UpgradeBody>(data);
    let _ = serde_json::from_slice::<ResizeBody>(data);
    let _ = serde_json::from_slice::<CreateJoinTokenBody>(data);
    let spec = spec();
    if let Ok(body) = serde_json::from_slice::<CreateClusterBody>(data) {
        let _ = flotilla::ids::validate_name(&body.name);
        for (role, r) in &body.roles {
            if let Some(count) = r.count {
                let _ = spec.check_count(role, count);
            }
        }
        if let Ok(config) = spec.resolve_config(&body.config, None) {
            // What resolved once resolves the same on top of itself (a
            // config change whose values are all the current ones).
            let again = spec.resolve_config(&body.config, Some(&config)).expect("resolving again");
            assert_eq!(again, config);
        }
    }
    if let Ok(body) = serde_json::from_slice::<ConfigBody>(data) {
        let _ = spec.resolve_config(&body.config, None);
    }
});
