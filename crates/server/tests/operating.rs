//! Operating a node, as a new user meets it: the real binary's logs (no colours in a pipe, a
//! startup line naming every listener, a warning when no rule applies, a startup error said
//! once), `tollgate rules validate` for CI, gRPC reflection as grpcurl and Python's client use
//! it, and concurrency slots counted released or not.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::Served;
use tollgate_proto::tollgate::ratelimit::v1::{
    CheckRateLimitRequest, Decision, Descriptor, ReleaseSlotsRequest, descriptor,
};
use tollgate_server::config::Settings;

fn tollgate() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    command.stdin(Stdio::null());
    command
}

/// Runs the binary until it exits (or is killed after `kill_after`): exit code and stderr.
async fn run(command: Command, kill_after: Option<Duration>) -> (Option<i32>, String) {
    let mut child = tokio::process::Command::from(command)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start tollgate");
    let mut stderr = child.stderr.take().expect("stderr");
    let reader = tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        text
    });
    if let Some(after) = kill_after
        && tokio::time::timeout(after, child.wait()).await.is_err()
    {
        let _ = child.kill().await;
    }
    let status = child.wait().await.expect("wait");
    (status.code(), reader.await.expect("stderr"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_plain_name_every_listener_and_warn_of_an_empty_rule_set() {
    let mut command = tollgate();
    command.args([
        "--grpc-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
    ]);
    let (_, log) = run(command, Some(Duration::from_secs(2))).await;
    assert!(
        !log.contains('\u{1b}'),
        "no ANSI colours in a pipe: {log:?}"
    );
    let serving = log
        .lines()
        .find(|l| l.contains("tollgate node serving"))
        .unwrap_or_else(|| panic!("a startup line: {log}"));
    for listener in ["grpc=", "http=", "admin=", "region_link="] {
        assert!(serving.contains(listener), "{listener} in {serving}");
    }
    assert!(
        log.contains("the rule set is empty: every request is allowed"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_startup_error_is_said_once_and_plainly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "domain: d\nrules:\n  - {id: x, algorithm: TOKEN_BUCKET, capacity: -1, refillPerSecond: 1}\n",
    )
    .expect("write");
    let mut command = tollgate();
    command.arg("--rules").arg(&rules);
    let (code, log) = run(command, None).await;
    assert_eq!(code, Some(2), "{log}");
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 1, "said once: {log}");
    assert!(
        lines[0].contains("rules.yaml:3") && lines[0].contains("capacity"),
        "{log}"
    );
    assert!(
        !log.contains("RulesError") && !log.contains(" { "),
        "no Debug dump: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_validate_checks_files_of_both_formats_for_ci() {
    let deploy = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/rules");
    let mut good = tollgate();
    good.args(["rules", "validate"])
        .arg(format!("{deploy}/example.yaml"))
        .arg(format!("{deploy}/envoy/config.yaml"));
    let (code, log) = run(good, None).await;
    assert_eq!(code, Some(0), "{log}");

    let dir = tempfile::tempdir().expect("tempdir");
    let envoy = dir.path().join("envoy.yaml");
    std::fs::write(
        &envoy,
        "domain: e\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 3}\n  - key: b\n    rate_limit:\n      unit: parsec\n      requests_per_unit: 1\n",
    )
    .expect("write");
    let mut bad = tollgate();
    bad.args(["rules", "validate"]).arg(&envoy);
    let (code, log) = run(bad, None).await;
    assert_eq!(code, Some(2), "{log}");
    assert!(
        log.contains("envoy.yaml:6") && log.contains("parsec"),
        "line and field: {log}"
    );

    // Two files that each load, but not together: the same id twice.
    let a = dir.path().join("a.yaml");
    let b = dir.path().join("b.yaml");
    for file in [&a, &b] {
        std::fs::write(
            file,
            "domain: d\nrules:\n  - {id: same, algorithm: FIXED_WINDOW, limit: 1, window: 1s}\n",
        )
        .expect("write");
    }
    let mut together = tollgate();
    together.args(["rules", "validate"]).arg(&a).arg(&b);
    let (code, log) = run(together, None).await;
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("duplicate rule id"), "{log}");
}

/// `tollgate rules validate` says every error at once (every field at fault of every rule of
/// every file), each with its file and line, the line said once; a trailing `---` has its line; `failMode: closed` is CLOSED; an empty file and
/// an unread subfolder are named, and fail the check only with `--strict`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_validate_says_every_error_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules");
    std::fs::create_dir_all(rules.join("old")).expect("mkdir");
    std::fs::write(
        rules.join("three.yaml"),
        "domain: d\nrules:\n  - {id: a, algorithm: TOKEN_BUCKET, capacity: 0, refillPerSecond: 1}\n  - {id: b, algorithm: FIXED_WINDOW, limit: 5, window: 1m, failMode: closed}\n  - id: c\n    algorithm: LEAKY\n    limit: 5\n  - {id: d, algorithm: FIXED_WINDOW, limit: 5, window: soon, mode: OFF}\n",
    )
    .expect("write");
    std::fs::write(rules.join("trailing.yaml"), "domain: t\nrules: []\n---\n").expect("write");
    std::fs::write(
        rules.join("broken.yaml"),
        "domain: e\nrules:\n  - id: x\n    algorithm: FIXED_WINDOW\n    limit: [1\n",
    )
    .expect("write");
    std::fs::write(rules.join("empty.yaml"), "# nothing yet\n").expect("write");
    let mut all = tollgate();
    all.args(["rules", "validate"]).arg(&rules);
    let (code, log) = run(all, None).await;
    assert_eq!(code, Some(2), "{log}");
    for expected in [
        "three.yaml:3: rule \"a\"",
        "three.yaml:6: rule \"c\"",
        "three.yaml:8: rule \"d\"",
        "trailing.yaml:3: more than one YAML document",
        "broken.yaml:6: ",
        "empty.yaml: empty",
        "old: a subfolder, not read",
        "field `mode`: unknown mode \"OFF\"",
        "6 errors found",
    ] {
        assert!(log.contains(expected), "{expected:?} in {log}");
    }
    assert!(
        !log.contains("rule \"b\""),
        "failMode: closed is CLOSED: {log}"
    );
    assert!(!log.contains("at line 6"), "the line is said once: {log}");

    for bad in ["three.yaml", "trailing.yaml", "broken.yaml"] {
        std::fs::remove_file(rules.join(bad)).expect("remove");
    }
    let mut lenient = tollgate();
    lenient.args(["rules", "validate"]).arg(&rules);
    let (code, log) = run(lenient, None).await;
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("empty.yaml: empty"), "still named: {log}");
    let mut strict = tollgate();
    strict.args(["rules", "validate", "--strict"]).arg(&rules);
    let (code, log) = run(strict, None).await;
    assert_eq!(code, Some(2), "{log}");
}

/// grpcurl and Python's reflection client ask v1alpha; both versions list the public services
/// (health included) and never the region link, which has its own port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_serves_v1_and_v1alpha_and_lists_only_the_public_services() {
    use tonic_reflection::pb::{v1, v1alpha};
    let mut served = Served::start("domain: d\nrules: []\n", Settings::default()).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", served.grpc))
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut alpha = v1alpha::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut stream = alpha
        .server_reflection_info(futures::stream::iter(vec![request]))
        .await
        .expect("v1alpha answers")
        .into_inner();
    let reply = stream.message().await.expect("reply").expect("a reply");
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        reply.message_response
    else {
        panic!("not a service list: {reply:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in [
        "envoy.service.ratelimit.v3.RateLimitService",
        "tollgate.ratelimit.v1.RateLimiter",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} in {names:?}"
        );
    }
    assert!(
        names.iter().all(|n| !n.contains("regionsync")),
        "the region link is not advertised: {names:?}"
    );
    let mut stable = v1::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut stream = stable
        .server_reflection_info(futures::stream::iter(vec![request]))
        .await
        .expect("v1 answers")
        .into_inner();
    assert!(stream.message().await.expect("reply").is_some());
    served.stop().await;
}

/// Slots released while held and releases that came too late are counted apart, so an
/// operator sees slots that expired instead of being released (Envoy never releases).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_metrics_tell_released_from_expired() {
    let rules = "domain: api\nrules:\n  - {id: reports, match: {route: GET /reports, api_key: '*'}, per: [api_key], algorithm: CONCURRENCY, maxInFlight: 2, slotTtl: 1s}\n";
    let mut served = Served::start(rules, Settings::default()).await;
    let mut api = served.api().await;
    let request = CheckRateLimitRequest {
        domain: "api".into(),
        descriptors: vec![Descriptor {
            entries: [("route", "GET /reports"), ("api_key", "k1")]
                .into_iter()
                .map(|(k, v)| descriptor::Entry {
                    key: k.into(),
                    value: v.into(),
                })
                .collect(),
        }],
        cost: 1,
        with_headers: false,
        reserve_ttl_ms: 0,
    };
    let first = api
        .check_rate_limit(request.clone())
        .await
        .expect("ok")
        .into_inner();
    let second = api
        .check_rate_limit(request.clone())
        .await
        .expect("ok")
        .into_inner();
    assert_eq!(
        (first.decision, second.decision),
        (Decision::Allow as i32, Decision::Allow as i32)
    );
    let release = |slots: Vec<String>| ReleaseSlotsRequest {
        domain: "api".into(),
        slots,
    };
    assert_eq!(
        api.release_slots(release(first.slots.clone()))
            .await
            .expect("ok")
            .into_inner()
            .released,
        1
    );
    // The second slot is never released: it expires after its TTL, and a late release finds
    // nothing to release.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(
        api.release_slots(release(second.slots.clone()))
            .await
            .expect("ok")
            .into_inner()
            .released,
        0
    );
    let (_, metrics) = served.get("/metrics").await;
    let value = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<u64>().ok())
    };
    assert_eq!(value("tollgate_slots_taken_total"), Some(2), "{metrics}");
    assert_eq!(value("tollgate_slots_released_total"), Some(1));
    assert_eq!(value("tollgate_slots_release_missed_total"), Some(1));
    served.stop().await;
}

/// Requests are counted per API and result, timed per API, and a request no rule matches is
/// counted as such (it is admitted: nothing limits it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_counted_per_api_and_result_and_unmatched_ones_apart() {
    let rules = "domain: api\nrules:\n  - {id: per-key, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 1, refillPerSecond: 0.001}\n";
    let mut served = Served::start(rules, Settings::default()).await;
    let mut rls = served.rls().await;
    for domain in ["api", "api", "elsewhere"] {
        rls.should_rate_limit(support::rls_request(domain, &[&[("api_key", "k1")]]))
            .await
            .expect("answered");
    }
    let mut bad = support::rls_request("api", &[&[("api_key", "k1")]]);
    bad.descriptors[0].is_negative_hits = true;
    assert!(rls.should_rate_limit(bad).await.is_err(), "refused");
    let (_, metrics) = served.get("/metrics").await;
    let value = |sample: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(sample))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<u64>().ok())
    };
    // The first request is admitted, the second is over the limit, the third matches nothing.
    assert_eq!(
        value(r#"tollgate_requests_total{api="rls",result="ok"}"#),
        Some(2),
        "{metrics}"
    );
    assert_eq!(
        value(r#"tollgate_requests_total{api="rls",result="over_limit"}"#),
        Some(1)
    );
    assert_eq!(
        value(r#"tollgate_requests_total{api="rls",result="invalid"}"#),
        Some(1)
    );
    assert_eq!(
        value(r#"tollgate_requests_total{api="check",result="ok"}"#),
        Some(0)
    );
    assert_eq!(
        value(r#"tollgate_request_seconds_count{api="rls"}"#),
        Some(4)
    );
    assert_eq!(value("tollgate_requests_unmatched_total"), Some(1));
    served.stop().await;
}

/// `/top-denied` lists the most-denied keys, overall and per rule, to a bearer token only: the
/// HTTP port is open to whatever scrapes it, and identities may be API keys. Without a token
/// configured it is not served there; identities are truncated by default, shown whole only
/// when asked (`plain`), and `hashed` is an HMAC under the deployment's secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_most_denied_keys_are_served_to_a_token_and_identities_kept_private() {
    let rules = "domain: api\nrules:\n  - {id: per-key, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 1, refillPerSecond: 0.001}\n";
    const TOKEN: &str = "a-token-for-top-denied";
    let unserved = Served::start(rules, Settings::default()).await;
    let (status, body) = unserved.get("/top-denied").await;
    assert_eq!(status, 404, "not served without a token configured: {body}");
    assert!(body.contains("not-served"), "{body}");
    for (shown, expect) in [
        (None, "truncated"),
        (Some("plain"), "plain"),
        (Some("hashed"), "hashed"),
    ] {
        let settings = Settings {
            top_denied_identities: shown.map(String::from),
            top_denied_secret: Some("a-deployment-secret".into()),
            top_denied_token: Some(TOKEN.into()),
            ..Settings::default()
        };
        let mut served = Served::start(rules, settings).await;
        let mut rls = served.rls().await;
        // Denials per key (the limit admits one): the first key 5, the second 2, the third none.
        for (key, n) in [
            ("sk_live_most_123456", 6),
            ("sk_live_some_98765", 3),
            ("sk_none", 1),
        ] {
            for _ in 0..n {
                rls.should_rate_limit(support::rls_request("api", &[&[("api_key", key)]]))
                    .await
                    .expect("answered");
            }
        }
        for refused in [
            &[][..],
            &["Authorization: Bearer "],
            &["Authorization: Bearer a-wrong-token-of-a-length"],
            &["Authorization: Basic YWRtaW46YWRtaW4="],
        ] {
            let (status, body) = served.get_with("/top-denied", refused).await;
            assert_eq!(status, 401, "{refused:?}: {body}");
            assert!(!body.contains("sk_live"), "{body}");
        }
        let bearer = format!("Authorization: Bearer {TOKEN}");
        let (status, body) = served.get_with("/top-denied", &[&bearer]).await;
        assert_eq!(status, 200, "{body}");
        let report: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(report["denials"], 7, "{report}");
        let listed: Vec<(String, u64)> = report["rules"]["per-key"]
            .as_array()
            .expect("the rule's list")
            .iter()
            .map(|k| {
                (
                    k["identity"].as_str().expect("identity").to_owned(),
                    k["denied"].as_u64().expect("count"),
                )
            })
            .collect();
        assert_eq!(listed.len(), 2, "{listed:?}");
        assert_eq!((listed[0].1, listed[1].1), (5, 2), "{listed:?}");
        assert_eq!(report["overall"][0]["rule"], "per-key");
        match expect {
            "plain" => assert_eq!(listed[0].0, "sk_live_most_123456"),
            "truncated" => {
                assert_eq!(listed[0].0, "sk_liv…");
                assert!(!body.contains("sk_live_most"), "{body}");
            }
            _ => {
                assert!(
                    listed.iter().all(|(id, _)| id.starts_with("hmac:")),
                    "{listed:?}"
                );
                assert!(!body.contains("sk_live"), "{body}");
            }
        }
        served.stop().await;
    }
}
