//! The `ec2` driver's parts that need no EC2: the signature (against
//! AWS's published example), the answers' parsing, error classes, the
//! settings' checks and the user data. The driver against a real Query
//! API (moto) is `tests/integration/pools/ec2.rs`.

use std::collections::BTreeMap;

use crate::providers::driver::{ErrorClass, LaunchSpec};
use crate::providers::ec2::{Ec2Driver, Ec2Settings};
use crate::providers::ec2_api::{Credentials, amz_date, classify, error_of, form, hmac, instances, sign};

#[test]
fn hmac_matches_rfc_4231() {
    // Test case 1 and test case 6 (a key longer than the block).
    assert_eq!(
        hex::encode(hmac(&[0x0b; 20], b"Hi There")),
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
    );
    assert_eq!(
        hex::encode(hmac(&[0xaa; 131], b"Test Using Larger Than Block-Size Key - Hash Key First")),
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
    );
}

#[test]
fn the_signature_is_aws_published_example() {
    // The IAM ListUsers example of AWS's Signature Version 4 documentation.
    let creds = Credentials {
        access_key_id: "AKIDEXAMPLE".into(),
        secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
        session_token: None,
    };
    let now = time::macros::datetime!(2015-08-30 12:36:00 UTC);
    assert_eq!(amz_date(now), "20150830T123600Z");
    let headers = BTreeMap::from([
        ("content-type".to_string(), "application/x-www-form-urlencoded; charset=utf-8".to_string()),
        ("host".to_string(), "iam.amazonaws.com".to_string()),
        ("x-amz-date".to_string(), "20150830T123600Z".to_string()),
    ]);
    let auth = sign(&creds, "us-east-1", "iam", "GET", "/", "Action=ListUsers&Version=2010-05-08", &headers, b"", now);
    assert_eq!(
        auth,
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, \
         SignedHeaders=content-type;host;x-amz-date, \
         Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
    );
    // A POST as the driver sends it (an endpoint with a port, a session
    // token), signed as botocore's SigV4Auth signs it (its answer for this
    // request, computed once with botocore 1.x and kept here).
    let client = crate::providers::ec2_api::Client::new(
        "http://127.0.0.1:5999/".parse().unwrap(),
        "us-east-1".into(),
        Credentials { session_token: Some("session-token-x".into()), ..creds },
        5,
    )
    .unwrap();
    let body = "Action=DescribeInstances&Version=2016-11-15&Filter.1.Name=tag%3Aflotilla-master&Filter.1.Value.1=0123456789abcdef";
    let headers = client.signed_headers(body, time::macros::datetime!(2026-01-02 03:04:05 UTC)).unwrap();
    assert_eq!(
        headers["authorization"],
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260102/us-east-1/ec2/aws4_request, \
         SignedHeaders=content-type;host;x-amz-date;x-amz-security-token, \
         Signature=8ec02bb463fcfc4770a03a8989e3d75913af54c2a38b34a84c6a17b6c7cb8539"
    );
    assert_eq!(
        (headers["host"].as_str(), headers["x-amz-security-token"].as_str()),
        ("127.0.0.1:5999", "session-token-x")
    );
    // What a form body encodes: RFC 3986, spaces as %20.
    assert_eq!(form(&[("a b".into(), "x/y=z~".into())]), "a%20b=x%2Fy%3Dz~");
}

const DESCRIBE: &str = r#"<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
<requestId>r</requestId>
<reservationSet><item><reservationId>r-1</reservationId><instancesSet>
  <item><instanceId>i-1</instanceId><instanceState><code>16</code><name>running</name></instanceState>
    <blockDeviceMapping><item><deviceName>/dev/sda1</deviceName></item></blockDeviceMapping>
    <tagSet><item><key>flotilla-node</key><value>e-1</value></item><item><key>Name</key><value>e-1</value></item></tagSet></item>
  <item><instanceId>i-2</instanceId><instanceState><code>0</code><name>pending</name></instanceState><tagSet/></item>
</instancesSet></item>
<item><reservationId>r-2</reservationId><instancesSet>
  <item><instanceId>i-3</instanceId><instanceState><code>32</code><name>shutting-down</name></instanceState></item>
</instancesSet></item></reservationSet>
<nextToken>page-2</nextToken>
</DescribeInstancesResponse>"#;

#[test]
fn answers_are_read_whatever_item_nesting_they_carry() {
    let (found, next) = instances(DESCRIBE, "DescribeInstances").unwrap();
    let ids: Vec<&str> = found.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["i-1", "i-2", "i-3"], "block devices' items are no instances");
    assert_eq!(found[0].tags.get("flotilla-node").map(String::as_str), Some("e-1"));
    assert_eq!((found[0].state.as_str(), found[2].state.as_str()), ("running", "shutting-down"));
    assert_eq!(next.as_deref(), Some("page-2"));
    let run = r#"<RunInstancesResponse><instancesSet><item><instanceId>i-9</instanceId>
        <instanceState><name>pending</name></instanceState></item></instancesSet></RunInstancesResponse>"#;
    assert_eq!(instances(run, "RunInstances").unwrap().0[0].id, "i-9");
    let empty = "<DescribeInstancesResponse><reservationSet/></DescribeInstancesResponse>";
    assert_eq!(instances(empty, "DescribeInstances").unwrap(), (vec![], None), "no instance: an empty listing");
    // Hostile or wrong answers: an error, never a panic, never an empty listing.
    assert!(instances("<oops", "DescribeInstances").is_err());
    let no_id = "<RunInstancesResponse><instancesSet><item><x/></item></instancesSet></RunInstancesResponse>";
    assert!(instances(no_id, "RunInstances").is_err(), "an instance without id");
    assert!(instances("<DescribeInstancesResponse/>", "DescribeInstances").is_err(), "no reservationSet");
    assert!(instances("<html><body>proxy error</body></html>", "DescribeInstances").is_err(), "another answer");
    assert!(instances(DESCRIBE, "RunInstances").is_err(), "another action's answer");
}

#[test]
fn ec2_error_codes_become_the_launchers_classes() {
    let answer = r#"<?xml version="1.0"?><Response><Errors><Error><Code>InsufficientInstanceCapacity</Code>
        <Message>no m6i.large in us-east-1a</Message></Error></Errors><RequestID>x</RequestID></Response>"#;
    assert_eq!(
        error_of(answer),
        Some(("InsufficientInstanceCapacity".to_string(), "no m6i.large in us-east-1a".to_string()))
    );
    for (code, class) in [
        ("InsufficientInstanceCapacity", ErrorClass::Capacity),
        ("InstanceLimitExceeded", ErrorClass::Quota),
        ("VcpuLimitExceeded", ErrorClass::Quota),
        ("RequestLimitExceeded", ErrorClass::Transient),
        ("InternalError", ErrorClass::Transient),
        ("InvalidAMIID.NotFound", ErrorClass::Config),
        ("UnauthorizedOperation", ErrorClass::Config),
        ("AuthFailure", ErrorClass::Config),
        ("ExpiredToken", ErrorClass::Config),
        ("RequestExpired", ErrorClass::Config),
        ("SomethingNew", ErrorClass::Transient),
    ] {
        assert_eq!(classify(code), class, "{code}");
    }
}

fn settings(extra: serde_json::Value) -> Result<Ec2Settings, (String, String)> {
    let mut v = serde_json::json!({
        "region": "us-east-1", "image_id": "ami-12c6146b", "instance_type": "t2.micro",
        "agent_url": "https://artifacts.example.com/flotilla", "agent_sha256": "ab".repeat(32),
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    Ec2Settings::from_value(v, "0123456789abcdef", "e")
}

#[test]
fn settings_are_checked_and_errors_name_the_key() {
    let s = settings(serde_json::json!({})).unwrap();
    assert_eq!(s.endpoint.as_str(), "https://ec2.us-east-1.amazonaws.com/");
    assert_eq!((s.agent_dir.as_str(), s.calls_per_second), ("/var/lib/flotilla-node", 5));
    for (bad, key) in [
        (serde_json::json!({"image_id": "ami-1; rm -rf /"}), "image_id"),
        (serde_json::json!({"agent_url": "https://x/$(id)"}), "agent_url"),
        (serde_json::json!({"agent_url": "ftp://x/f"}), "agent_url"),
        (serde_json::json!({"agent_sha256": "abc"}), "agent_sha256"),
        (serde_json::json!({"agent_dir": "/a/../b"}), "agent_dir"),
        (serde_json::json!({"calls_per_second": 0}), "calls_per_second"),
        (serde_json::json!({"endpoint": "not a url"}), "endpoint"),
        (serde_json::json!({"zone": "a"}), ""),
    ] {
        let e = settings(bad.clone()).unwrap_err();
        assert!(e.0 == key || (key.is_empty() && e.1.contains("zone")), "{bad}: {e:?}");
    }
    let missing = Ec2Settings::from_value(serde_json::json!({"region": "x"}), "i", "p").unwrap_err();
    assert!(missing.1.contains("image_id"), "{missing:?}");
}

#[test]
fn the_user_data_checks_the_binary_and_keeps_the_token_off_command_lines() {
    let driver = Ec2Driver::new(settings(serde_json::json!({"master_host": "10.0.0.5"})).unwrap(), creds()).unwrap();
    let spec = LaunchSpec::for_test("e-1", "0.0.0.0:7071");
    let script = driver.user_data(&spec).unwrap();
    assert!(script.starts_with("#!/bin/sh\n"), "{script}");
    assert!(script.contains(&format!("[ \"$got\" != '{}' ]", "ab".repeat(32))), "the sha256 is checked: {script}");
    assert!(script.contains("--node-id e-1 --master 10.0.0.5:7071"), "{script}");
    assert!(script.contains("--label zone=a"), "{script}");
    assert!(script.contains("systemctl enable --now flotilla-agent-e-1.service"), "{script}");
    // The token only goes to the private env file.
    let token_lines: Vec<&str> = script.lines().filter(|l| l.contains(&spec.join_token)).collect();
    assert_eq!(token_lines.len(), 1, "{script}");
    assert!(token_lines[0].contains("umask 077") && token_lines[0].contains("agent.env"), "{}", token_lines[0]);
    // A listener on every interface and no master_host: a config error.
    let plain = Ec2Driver::new(settings(serde_json::json!({})).unwrap(), creds()).unwrap();
    let e = plain.user_data(&spec).unwrap_err();
    assert_eq!(e.class, ErrorClass::Config, "{e}");
    assert!(e.message.contains("master_host"), "{e}");
}

fn creds() -> Credentials {
    Credentials { access_key_id: "testing".into(), secret_access_key: "testing".into(), session_token: None }
}
