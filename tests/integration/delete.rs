//! Delete: processes, directories and records are gone everywhere, and the
//! name can be used again at once.

use serde_json::json;

use crate::common::http::error_code;
use crate::common::scripts::RECORD_AND_SLEEP;
use crate::common::{PackageBuilder, TestEnv, dir_of, id_of, instance_pids, pid_alive, pid_of, role_instances};

const SPEC: &str = r#"
[component]
name = "del"
version = "1.0.0"

[[roles]]
name = "svc"
count = { min = 1, max = 5 }
start = ["bin/start.sh"]
stop_grace = "2s"
"#;

#[tokio::test]
async fn delete_removes_everything_and_frees_the_name() {
    let env = TestEnv::start("delete").await;
    env.upload(&PackageBuilder::new("del", "1.0.0").spec(SPEC).script("bin/start.sh", RECORD_AND_SLEEP)).await;
    let body = json!({"name": "dd", "package": {"name": "del", "version": "1.0.0"}, "roles": {"svc": {"count": 3}}});
    let instances = role_instances(&env.create_active(body.clone()).await, "svc");
    assert_eq!(instances.len(), 3);
    for i in &instances {
        assert!(dir_of(i).is_dir(), "{} is not there before delete", dir_of(i).display());
    }

    let (status, resp) = env.delete("/clusters/dd").await;
    assert_eq!(status, 202, "DELETE /clusters/dd: {resp:#}");
    assert_eq!(resp["operation"]["kind"], "Delete");
    let op = env.wait_op(resp["operation"]["id"].as_str().unwrap()).await;
    env.assert_succeeded(&op);

    for i in &instances {
        let id = id_of(i);
        assert_eq!(instance_pids(&id), Vec::<u32>::new(), "processes of {id} survived delete");
        assert!(!pid_alive(pid_of(i)));
        assert!(!dir_of(i).exists(), "{} survived delete", dir_of(i).display());
    }
    let (status, resp) = env.get("/clusters/dd").await;
    assert_eq!((status.as_u16(), error_code(&resp)), (404, "not_found"), "{resp:#}");
    let (_, list) = env.get("/clusters").await;
    assert_eq!(list["clusters"], json!([]), "{list:#}");
    for node in instances.iter().map(|i| i["node"].as_str().unwrap()) {
        let (status, n) = env.get(&format!("/nodes/{node}")).await;
        assert_eq!(status, 200, "GET /nodes/{node}: {n:#}");
        let held = n["instances"].as_array().expect("instances");
        assert!(held.is_empty(), "node {node} still lists instances {held:?}");
    }

    // The name is free at once.
    let again = role_instances(&env.create_active(body).await, "svc");
    assert_eq!(again.len(), 3);
    for i in &again {
        assert_eq!(i["status"], "Running", "{i:#}");
        assert!(pid_alive(pid_of(i)));
        assert!(instances.iter().all(|old| old["id"] != i["id"]), "instance id {} reused", i["id"]);
    }
}
