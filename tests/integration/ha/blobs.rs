//! Package tarballs on several masters: an upload is accepted once a
//! majority of the masters hold it, the others fetch it (and fetch again
//! what their disk lost), a new leader installs from its own disk after
//! the old one is killed, and without a majority an upload is refused and
//! leaves no package.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::super::master_restart::SPEC;
use crate::common::TestEnv;
use crate::common::etcd::EtcdCluster;
use crate::common::package::PackageBuilder;
use crate::common::procfs::eventually;
use crate::common::scripts::RECORD_AND_SLEEP;

/// The sha256 of master `i`'s copy of the tarball, if it has one.
fn held(env: &TestEnv, i: usize, sha: &str) -> Option<String> {
    let bytes = std::fs::read(env.ha_dir(i).join("packages").join(sha)).ok()?;
    Some(hex::encode(Sha256::digest(&bytes)))
}

#[tokio::test]
async fn a_package_is_on_a_majority_of_masters_when_accepted_and_survives_the_leader() {
    let etcd = EtcdCluster::start(3);
    let mut env = TestEnv::start_ha_serving("ha-blobs", &etcd, 3).await;

    let pkg = PackageBuilder::new("mr", "1.0.0").spec(SPEC).script("bin/start.sh", RECORD_AND_SLEEP);
    let uploaded = env.upload(&pkg).await;
    let sha = uploaded["sha256"].as_str().expect("sha256").to_string();
    // Accepted: on the leader and on at least one other master already,
    // each copy whole (its digest is its name).
    let copies = (0..3).filter(|i| held(&env, *i, &sha).as_deref() == Some(sha.as_str())).count();
    assert!(copies >= 2, "the upload was accepted with {copies} of 3 masters holding it");
    assert!(eventually(20, || (0..3).all(|i| held(&env, i, &sha).as_deref() == Some(sha.as_str()))).await);

    // Only another master may call the blob route, for the master it names.
    let secret = etcd.ctl(&["get", "/ha-blobs/_peer_secret", "--print-value-only"]).trim().to_string();
    assert_eq!(secret.len(), 64, "the peer secret in etcd: {secret:?}");
    let url = format!("{}/internal/v1/blobs/{sha}", env.ha_api(1).trim_end_matches("/api/v1"));
    let plain = reqwest::Client::builder().no_proxy().build().unwrap();
    let call = |auth: &str, to: &str, from: &str| {
        plain
            .get(&url)
            .header("authorization", auth)
            .header("x-flotilla-peer-to", to)
            .header("x-flotilla-peer-from", from)
    };
    let status = |r: reqwest::Result<reqwest::Response>| r.expect("the blob route").status();
    assert_eq!(status(plain.get(&url).send().await), StatusCode::UNAUTHORIZED);
    assert_eq!(status(call("Peer nope", "m1", "m2").send().await), StatusCode::UNAUTHORIZED);
    assert_eq!(status(call(&format!("Bearer {}", env.token), "m1", "m2").send().await), StatusCode::UNAUTHORIZED);
    let peer = format!("Peer {secret}");
    assert_eq!(status(call(&peer, "m2", "m0").send().await), StatusCode::CONFLICT, "a transfer meant for another");
    let got = call(&peer, "m1", "m2").send().await.expect("the blob").bytes().await.expect("its bytes");
    assert_eq!(hex::encode(Sha256::digest(&got)), sha, "master 1 served another tarball");
    // A tarball whose bytes are not its name is refused, and not kept.
    let fake = "0".repeat(64);
    let fake_url = url.replace(&sha, &fake);
    let r = plain
        .put(&fake_url)
        .header("authorization", &peer)
        .header("x-flotilla-peer-to", "m1")
        .header("x-flotilla-peer-from", "m2")
        .body(b"not what the name says".to_vec())
        .send()
        .await
        .expect("a put");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(held(&env, 1, &fake).is_none(), "a tarball of the wrong digest was kept");

    // A master whose disk lost it fetches it again.
    std::fs::remove_file(env.ha_dir(2).join("packages").join(&sha)).expect("remove master 2's copy");
    let back = eventually(20, || held(&env, 2, &sha).as_deref() == Some(sha.as_str())).await;
    assert!(back, "master 2 did not fetch the tarball again\n{}", env.ha_log(2));

    // The leader killed, the next one installs from its own disk.
    env.kill_master();
    let (now, _) = env.follow_leader(Some(0), Duration::from_secs(20)).await;
    env.wait_ready().await;
    let body = json!({"name": "mr", "package": {"name": "mr", "version": "1.0.0"}, "roles": {"svc": {"count": 2}}});
    let c = env.create_active(body).await;
    assert_eq!(c["status"], "Active", "{c:#}");

    // The new leader alone (the other follower killed too): no majority,
    // so an upload is refused and no package is made.
    let other = if now == 1 { 2 } else { 1 };
    env.signal_ha(other, nix::sys::signal::Signal::SIGKILL);
    assert!(env.ha_exit_within(other, Duration::from_secs(10)).await.is_some());
    let pkg2 = PackageBuilder::new("mr", "2.0.0")
        .spec(&SPEC.replace("1.0.0", "2.0.0"))
        .script("bin/start.sh", RECORD_AND_SLEEP);
    let (status, body) = env.put_bytes("/packages/mr/2.0.0", pkg2.build()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body:#}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("majority") && message.contains("1 of 3"), "{message}");
    let (status, _) = env.get("/packages/mr/2.0.0").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "a refused upload left a package");
}
