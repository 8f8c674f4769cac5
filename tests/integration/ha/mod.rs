//! Several masters on etcd (issue 25): the store on real etcd members, the
//! leader's election and fence, and masters that take over.

mod bench_api;
mod big_failover;
mod blobs;
mod dev_ha;
mod fencing;
mod followers;
mod lease;
mod masters;
mod migrate;
mod partition;
mod rolling;
mod store;
mod watch;

use serde_json::{Value, json};

use crate::common::TestEnv;
use crate::common::package::PackageBuilder;
use crate::common::scripts::RECORD_AND_SLEEP;

/// Master `i`, deposed, exits within `within` and its log says why (its
/// lease gone, a write refused by the fence, the leader key found another's
/// while settling a write, or another master leading).
pub(crate) async fn exits_saying_why(env: &mut TestEnv, i: usize, within: std::time::Duration, who: &str) {
    let exit = env.ha_exit_within(i, within).await;
    let log = env.ha_log(i);
    assert!(exit.is_some(), "{who} did not exit\n{log}");
    assert!(
        log.contains("leadership")
            && ["refused by the fence", "lease is gone", "another master leads", "the leader key is no longer"]
                .iter()
                .any(|why| log.contains(why)),
        "{who}'s log does not say why it stopped\n{log}"
    );
}

/// Uploads `master_restart`'s package and makes cluster `mr` of `count`
/// members, Active; the cluster.
pub(crate) async fn create_mr(env: &TestEnv, count: u32) -> Value {
    let spec = super::master_restart::SPEC;
    env.upload(&PackageBuilder::new("mr", "1.0.0").spec(spec).script("bin/start.sh", RECORD_AND_SLEEP)).await;
    let body = json!({"name": "mr", "package": {"name": "mr", "version": "1.0.0"}, "roles": {"svc": {"count": count}}});
    env.create_active(body).await
}
