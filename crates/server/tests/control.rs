//! The rule control plane against a real PostgreSQL: the admin API (validation, versions,
//! authentication, history, paging), live propagation to several nodes (push and poll), the
//! kill switch, PostgreSQL outages, snapshots, 10,000 rules, and import/export.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::admin::{call, call_raw, get_json, json_of, postgres, rule_path};
use support::{Served, check};
use tollgate_control::RuleStore;
use tollgate_node::{Node, Request};
use tollgate_server::config::Settings;

const SEED_BODY: &str = r#"{ "match": { "plan": "gold", "route": "POST /orders" },
  "algorithm": "TOKEN_BUCKET", "capacity": 100, "refillPerSecond": 10,
  "mode": "ENFORCE", "failMode": "OPEN" }"#;

/// Waits until `node` runs rule set `revision` or later; returns how long that took.
async fn until_revision(node: &Node, revision: u64) -> Duration {
    let start = tokio::time::Instant::now();
    while node.rules().version() < revision {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "revision {revision} never reached the node"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    start.elapsed()
}

fn gold(key: &str) -> Request {
    Request::new("public-api")
        .descriptor([("api_key", key), ("plan", "gold")])
        .descriptor([("route", "POST /orders")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_body_works_as_written_and_every_node_enforces_it() {
    let pg = postgres().await;
    let domain = Settings {
        default_domain: Some("public-api".into()),
        prelimit_factor: Some(0.0),
        ..Settings::default()
    };
    let mut nodes = vec![];
    for _ in 0..3 {
        nodes.push(Served::with_database(&pg.url(), "", domain.clone()).await);
    }
    let admin = nodes[0].admin_port();
    let created = call(
        admin,
        "PUT",
        &rule_path("gold-orders-create"),
        &[("content-type", "application/json")],
        Some(SEED_BODY),
    )
    .await;
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(created.header("etag"), Some("\"1\""));
    assert_eq!(
        created.header("location"),
        Some("/admin/v1/rate-limit-rules/gold-orders-create")
    );
    let body = json_of(&created);
    assert_eq!(
        (
            body["capacity"].clone(),
            body["domain"].clone(),
            body["version"].clone()
        ),
        (json!(100), json!("public-api"), json!(1))
    );
    let store = RuleStore::new(&pg.url(), Duration::from_secs(2)).expect("store");
    let revision = store.revision().await.expect("revision") as u64;
    let mut slowest = Duration::ZERO;
    for node in &nodes {
        slowest = slowest.max(until_revision(&node.node, revision).await);
        let verdict = check(&node.node, &gold("k_123")).await;
        assert_eq!(
            verdict.decisive().map(|s| s.rule.id.as_str()),
            Some("gold-orders-create")
        );
    }
    eprintln!("the PUT reached all 3 nodes within {slowest:?} of returning");
    let got = call(admin, "GET", &rule_path("gold-orders-create"), &[], None).await;
    assert_eq!((got.status, got.header("etag")), (200, Some("\"1\"")));
    for mut node in nodes {
        node.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_rules_get_problem_details_naming_the_field() {
    let pg = postgres().await;
    let mut node = Served::with_database(&pg.url(), "", Settings::default()).await;
    let admin = node.admin_port();
    let cases: Vec<(&str, String, u16, &str)> = vec![
        (
            "zero capacity",
            r#"{"algorithm":"TOKEN_BUCKET","capacity":0,"refillPerSecond":1}"#.into(),
            400,
            "capacity",
        ),
        (
            "NaN-ish rate",
            r#"{"algorithm":"TOKEN_BUCKET","capacity":5,"refillPerSecond":-1}"#.into(),
            400,
            "refillPerSecond",
        ),
        (
            "unknown field",
            r#"{"algorithm":"TOKEN_BUCKET","capacty":5}"#.into(),
            400,
            "capacty",
        ),
        (
            "unknown algorithm",
            r#"{"algorithm":"LEAKY","limit":5}"#.into(),
            400,
            "algorithm",
        ),
        (
            "wrong parameter",
            r#"{"algorithm":"FIXED_WINDOW","limit":5,"window":"1m","capacity":3}"#.into(),
            400,
            "capacity",
        ),
        (
            "bad window",
            r#"{"algorithm":"FIXED_WINDOW","limit":5,"window":"soon"}"#.into(),
            400,
            "window",
        ),
        (
            "regional shares over 1",
            r#"{"algorithm":"FIXED_WINDOW","limit":5,"window":"1m","regional":{"policy":"SPLIT","shares":{"us":0.8,"eu":0.8}}}"#.into(),
            400,
            "regional.shares",
        ),
        (
            "unknown regional field",
            r#"{"algorithm":"FIXED_WINDOW","limit":5,"window":"1m","regional":{"policy":"SPLIT","share":0.5}}"#.into(),
            400,
            "share",
        ),
        (
            "GCRA without a rate",
            r#"{"algorithm":"GCRA","burst":5}"#.into(),
            400,
            "ratePerSecond",
        ),
        (
            "leaky bucket with a window",
            r#"{"algorithm":"LEAKY_BUCKET","limit":5,"window":"1m"}"#.into(),
            400,
            "window",
        ),
        (
            "penalty of no denials",
            r#"{"algorithm":"FIXED_WINDOW","limit":5,"window":"1m","penalty":{"after":0,"within":"1m","block":"1m"}}"#.into(),
            400,
            "penalty.after",
        ),
        (
            "id mismatch",
            r#"{"id":"other","algorithm":"FIXED_WINDOW","limit":5,"window":"1m"}"#.into(),
            400,
            "id",
        ),
        ("not JSON", "{algorithm".into(), 400, "body"),
        (
            "too large",
            format!(
                r#"{{"algorithm":"FIXED_WINDOW","limit":5,"window":"1m","name":"{}"}}"#,
                "x".repeat(100_000)
            ),
            413,
            "",
        ),
    ];
    for (name, body, status, field) in cases {
        let r = call(admin, "PUT", &rule_path("r1"), &[], Some(&body)).await;
        assert_eq!(r.status, status, "{name}: {r:?}");
        assert_eq!(
            r.header("content-type"),
            Some("application/problem+json"),
            "{name}"
        );
        let problem = json_of(&r);
        assert_eq!(problem["status"], json!(status), "{name}");
        if !field.is_empty() {
            assert_eq!(
                problem["errors"][0]["field"],
                json!(field),
                "{name}: {problem}"
            );
        }
    }
    let bad_id = call(
        admin,
        "PUT",
        "/admin/v1/rate-limit-rules/has%20space",
        &[],
        Some(SEED_BODY),
    )
    .await;
    assert_eq!(bad_id.status, 400);
    let bad_if_match = call(
        admin,
        "PUT",
        &rule_path("r1"),
        &[("if-match", "yesterday")],
        Some(SEED_BODY),
    )
    .await;
    assert_eq!(
        (
            bad_if_match.status,
            json_of(&bad_if_match)["errors"][0]["field"].clone()
        ),
        (400, json!("If-Match"))
    );
    assert_eq!(
        call(admin, "GET", &rule_path("missing"), &[], None)
            .await
            .status,
        404
    );
    assert_eq!(
        call(admin, "DELETE", &rule_path("missing"), &[], None)
            .await
            .status,
        404
    );
    // Nothing invalid was stored.
    let list = get_json(admin, "/admin/v1/rate-limit-rules").await;
    assert_eq!(list["items"], json!([]));
    node.stop().await;
}

/// Hostile input gets a 4xx problem, never a 500, and writes nothing: SQL metacharacters
/// and 10 KiB strings in ids, invalid UTF-8 in bodies and paths, negative numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_gets_problem_details_and_writes_nothing() {
    let pg = postgres().await;
    let mut node = Served::with_database(&pg.url(), "", Settings::default()).await;
    let admin = node.admin_port();
    let valid = r#"{"domain":"api","algorithm":"FIXED_WINDOW","limit":5,"window":"1m"}"#;
    let long = "a".repeat(10 * 1024);
    let cases: Vec<(&str, String, Vec<u8>, u16, &str)> = vec![
        (
            "SQL in the id",
            "/admin/v1/rate-limit-rules/x'%3B%20DROP%20TABLE%20rate_limit_rules%3B%20--".into(),
            valid.into(),
            400,
            "id",
        ),
        ("10 KiB id", rule_path(&long), valid.into(), 400, "id"),
        (
            "10 KiB name",
            rule_path("r1"),
            format!(r#"{{"algorithm":"FIXED_WINDOW","limit":5,"window":"1m","name":"{long}"}}"#)
                .into(),
            400,
            "name",
        ),
        (
            "invalid UTF-8 in the path",
            "/admin/v1/rate-limit-rules/%FF%FE".into(),
            valid.into(),
            400,
            "id",
        ),
        (
            "invalid UTF-8 in the body",
            rule_path("r1"),
            b"{\"algorithm\":\"FIXED_WINDOW\",\"limit\":5,\"window\":\"1m\",\"name\":\"\xff\xfe\"}"
                .to_vec(),
            400,
            "name",
        ),
        (
            "negative capacity",
            rule_path("r1"),
            br#"{"algorithm":"TOKEN_BUCKET","capacity":-5,"refillPerSecond":1}"#.to_vec(),
            400,
            "capacity",
        ),
        (
            "a number where a string goes",
            rule_path("r1"),
            br#"{"algorithm":7,"limit":5,"window":"1m"}"#.to_vec(),
            400,
            "algorithm",
        ),
        (
            "not an object",
            rule_path("r1"),
            b"[1,2,3]".to_vec(),
            400,
            "body",
        ),
        ("empty body", rule_path("r1"), vec![], 400, "body"),
        (
            "patch with a bad mode",
            rule_path("r1"),
            br#"{"mode":"OFF"}"#.to_vec(),
            400,
            "mode",
        ),
    ];
    for (name, path, body, status, field) in cases {
        let method = if name.starts_with("patch") {
            "PATCH"
        } else {
            "PUT"
        };
        if method == "PATCH" {
            // PATCH needs the rule to exist first.
            assert_eq!(
                call(admin, "PUT", &rule_path("r1"), &[], Some(valid))
                    .await
                    .status,
                201
            );
        }
        let r = call_raw(admin, method, &path, &[], Some(&body)).await;
        assert_eq!(r.status, status, "{name}: {r:?}");
        assert_eq!(
            r.header("content-type"),
            Some("application/problem+json"),
            "{name}"
        );
        let problem = json_of(&r);
        assert_eq!(
            problem["errors"][0]["field"],
            json!(field),
            "{name}: {problem}"
        );
    }
    // The one valid write (for the PATCH) is all there is, unchanged by the bad PATCH.
    let list = get_json(admin, "/admin/v1/rate-limit-rules").await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(
        (
            list["items"][0]["id"].clone(),
            list["items"][0]["version"].clone()
        ),
        (json!("r1"), json!(1))
    );
    // SQL metacharacters in values are stored as data, verbatim.
    let sneaky = r#"{"domain":"api","match":{"plan":"gold'); DELETE FROM rate_limit_rules; --"},"algorithm":"FIXED_WINDOW","limit":5,"window":"1m"}"#;
    assert_eq!(
        call(admin, "PUT", &rule_path("sneaky"), &[], Some(sneaky))
            .await
            .status,
        201
    );
    let stored = get_json(admin, &rule_path("sneaky")).await;
    assert_eq!(
        stored["match"]["plan"],
        json!("gold'); DELETE FROM rate_limit_rules; --")
    );
    let list = get_json(admin, "/admin/v1/rate-limit-rules").await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(2), "{list}");
    // A regional policy is stored (in its own column) and read back as written.
    let regional = r#"{"domain":"api","algorithm":"FIXED_WINDOW","limit":5,"window":"1m","regional":{"policy":"HOME_REGION","homeRegion":"eu","fallbackShare":0.2}}"#;
    assert_eq!(
        call(admin, "PUT", &rule_path("homed"), &[], Some(regional))
            .await
            .status,
        201
    );
    let stored = get_json(admin, &rule_path("homed")).await;
    assert_eq!(
        stored["regional"],
        json!({"policy": "HOME_REGION", "homeRegion": "eu", "fallbackShare": 0.2})
    );
    // So is a penalty.
    let penalized = r#"{"domain":"api","algorithm":"FIXED_WINDOW","limit":5,"window":"1m","penalty":{"after":10,"within":"1m","block":"15m"}}"#;
    assert_eq!(
        call(admin, "PUT", &rule_path("login"), &[], Some(penalized))
            .await
            .status,
        201
    );
    let stored = get_json(admin, &rule_path("login")).await;
    assert_eq!(
        stored["penalty"],
        json!({"after": 10, "within": "1m", "block": "15m"})
    );
    // GCRA and the leaky bucket are stored with their own parameters and read back as written.
    for (id, body, fields) in [
        (
            "gcra",
            r#"{"domain":"api","algorithm":"GCRA","burst":20,"ratePerSecond":2.5}"#,
            json!({"burst": 20, "ratePerSecond": 2.5}),
        ),
        (
            "leaky",
            r#"{"domain":"api","algorithm":"LEAKY_BUCKET","limit":600,"duration":"1m","burst":30}"#,
            json!({"limit": 600, "duration": "1m", "burst": 30}),
        ),
    ] {
        assert_eq!(
            call(admin, "PUT", &rule_path(id), &[], Some(body))
                .await
                .status,
            201
        );
        let stored = get_json(admin, &rule_path(id)).await;
        for (field, value) in fields.as_object().expect("fields") {
            assert_eq!(&stored[field], value, "{id}: {stored}");
        }
    }
    node.stop().await;
}

/// A burst of 100 changes from two writers on two nodes: every node of three ends on the
/// store's last revision and enforces the last version of every rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_converge_after_a_burst_of_100_changes() {
    let pg = postgres().await;
    let settings = Settings {
        default_domain: Some("burst".into()),
        prelimit_factor: Some(0.0),
        ..Settings::default()
    };
    let mut nodes = vec![];
    for _ in 0..3 {
        nodes.push(Served::with_database(&pg.url(), "", settings.clone()).await);
    }
    // Ten rules, each written ten times with a growing limit; two writers on two nodes.
    let write = |admin: u16, rules: Vec<usize>| async move {
        for version in 1..=10 {
            for &i in &rules {
                let body = format!(
                    r#"{{"match":{{"tenant":"t{i}"}},"per":["user"],"algorithm":"FIXED_WINDOW","limit":{},"window":"1h"}}"#,
                    i + version
                );
                let r = call(
                    admin,
                    "PUT",
                    &rule_path(&format!("tenant-{i}")),
                    &[],
                    Some(&body),
                )
                .await;
                assert!(matches!(r.status, 200 | 201), "{r:?}");
            }
        }
    };
    let (a, b) = tokio::join!(
        tokio::spawn(write(nodes[0].admin_port(), (0..5).collect())),
        tokio::spawn(write(nodes[1].admin_port(), (5..10).collect())),
    );
    a.expect("writer");
    b.expect("writer");
    let store = RuleStore::new(&pg.url(), Duration::from_secs(2)).expect("store");
    let revision = store.revision().await.expect("revision") as u64;
    assert!(revision >= 100, "100 changes, revision {revision}");
    for node in &nodes {
        until_revision(&node.node, revision).await;
        for i in 0..10 {
            let request = Request::new("burst")
                .descriptor([("tenant", format!("t{i}")), ("user", "u".into())]);
            assert_eq!(
                support::allowed(&node.node, &request, i + 12).await,
                i + 10,
                "rule tenant-{i} enforces its last version"
            );
        }
    }
    for mut node in nodes {
        node.stop().await;
    }
}

/// A SHADOW rule reports what it would deny and lets it through; flipped to ENFORCE live, it
/// starts blocking on every node, its counter carried over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_flips_to_enforce_live_and_starts_blocking() {
    let pg = postgres().await;
    let settings = Settings {
        default_domain: Some("public-api".into()),
        prelimit_factor: Some(0.0),
        ..Settings::default()
    };
    let (mut a, mut b) = (
        Served::with_database(&pg.url(), "", settings.clone()).await,
        Served::with_database(&pg.url(), "", settings).await,
    );
    let admin = a.admin_port();
    let trial = r#"{"match":{"plan":"gold"},"per":["api_key"],"algorithm":"FIXED_WINDOW","limit":3,"window":"1h","mode":"SHADOW"}"#;
    assert_eq!(
        call(admin, "PUT", &rule_path("trial"), &[], Some(trial))
            .await
            .status,
        201
    );
    let store = RuleStore::new(&pg.url(), Duration::from_secs(2)).expect("store");
    let revision = store.revision().await.expect("revision") as u64;
    for node in [&a, &b] {
        until_revision(&node.node, revision).await;
    }
    // Each node here has its own in-memory store: node a sees six requests against three.
    let mut would_deny = 0;
    for _ in 0..6 {
        let verdict = check(&a.node, &gold("k")).await;
        assert!(verdict.allowed, "SHADOW never blocks");
        let status = &verdict.statuses[0];
        assert_eq!(status.rule.id, "trial");
        would_deny += usize::from(!status.allowed);
    }
    assert_eq!(
        would_deny, 3,
        "six requests against a limit of three: three over it"
    );
    let flipped = call(
        admin,
        "PATCH",
        &rule_path("trial"),
        &[("if-match", "\"1\"")],
        Some(r#"{"mode":"ENFORCE"}"#),
    )
    .await;
    assert_eq!(flipped.status, 200, "{flipped:?}");
    for node in [&a, &b] {
        until_revision(&node.node, revision + 1).await;
    }
    assert!(
        !check(&a.node, &gold("k")).await.allowed,
        "ENFORCE blocks a key already over its limit"
    );
    assert_eq!(
        support::allowed(&b.node, &gold("k"), 5).await,
        3,
        "node b enforces too"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_guard_every_write_and_concurrent_writers_lose_nothing() {
    let pg = postgres().await;
    let mut node = Served::with_database(&pg.url(), "", Settings::default()).await;
    let admin = node.admin_port();
    let body = r#"{"domain":"api","algorithm":"FIXED_WINDOW","limit":1,"window":"1m"}"#;
    assert_eq!(
        call(
            admin,
            "PUT",
            &rule_path("counter"),
            &[("if-match", "*")],
            Some(body)
        )
        .await
        .status,
        412,
        "If-Match * needs the rule to exist"
    );
    assert_eq!(
        call(admin, "PUT", &rule_path("counter"), &[], Some(body))
            .await
            .status,
        201
    );
    assert_eq!(
        call(
            admin,
            "PUT",
            &rule_path("counter"),
            &[("if-match", "\"7\"")],
            Some(body)
        )
        .await
        .status,
        412
    );
    // Two writers each add 1 to the limit ten times, read-modify-write under If-Match,
    // retrying on 412: every increment must land.
    let writer = |admin: u16| async move {
        let mut retries = 0;
        for _ in 0..10 {
            loop {
                let current = call(admin, "GET", &rule_path("counter"), &[], None).await;
                let etag = current.header("etag").expect("etag").to_owned();
                let mut doc = json_of(&current);
                let limit = doc["limit"].as_u64().expect("limit");
                for k in ["version", "updatedAt", "updatedBy"] {
                    doc.as_object_mut().expect("object").remove(k);
                }
                doc["limit"] = json!(limit + 1);
                let put = call(
                    admin,
                    "PUT",
                    &rule_path("counter"),
                    &[("if-match", &etag)],
                    Some(&doc.to_string()),
                )
                .await;
                match put.status {
                    200 => break,
                    412 => retries += 1,
                    other => panic!("unexpected {other}: {put:?}"),
                }
            }
        }
        retries
    };
    let (a, b) = tokio::join!(tokio::spawn(writer(admin)), tokio::spawn(writer(admin)));
    let retries = a.expect("writer") + b.expect("writer");
    let last = get_json(admin, &rule_path("counter")).await;
    assert_eq!(
        last["limit"],
        json!(21),
        "an update was lost ({retries} retries)"
    );
    assert_eq!(last["version"], json!(21));
    let history = json_of(
        &call(
            admin,
            "GET",
            &format!("{}/history", rule_path("counter")),
            &[],
            None,
        )
        .await,
    );
    assert_eq!(history["items"].as_array().map(Vec::len), Some(21));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_authenticate_and_read_only_tokens_cannot_write() {
    let pg = postgres().await;
    let settings = Settings {
        admin_tokens: Some(vec!["alice:w-secret-of-16-chars".into()]),
        admin_read_tokens: Some(vec!["dash:r-secret-of-16-chars".into()]),
        default_domain: Some("public-api".into()),
        ..Settings::default()
    };
    let mut node = Served::with_database(&pg.url(), "", settings).await;
    let admin = node.admin_port();
    let write = [("authorization", "Bearer w-secret-of-16-chars")];
    let read = [("authorization", "Bearer r-secret-of-16-chars")];
    let missing = call(admin, "GET", "/admin/v1/rate-limit-rules", &[], None).await;
    assert_eq!(missing.status, 401);
    assert!(
        missing
            .header("www-authenticate")
            .is_some_and(|h| h.starts_with("Bearer"))
    );
    assert_eq!(
        call(
            admin,
            "GET",
            "/admin/v1/rate-limit-rules",
            &[("authorization", "Bearer nope")],
            None
        )
        .await
        .status,
        401
    );
    assert_eq!(
        call(admin, "PUT", &rule_path("r"), &read, Some(SEED_BODY))
            .await
            .status,
        403
    );
    let created = call(admin, "PUT", &rule_path("r"), &write, Some(SEED_BODY)).await;
    assert_eq!(
        (created.status, json_of(&created)["updatedBy"].clone()),
        (201, json!("alice"))
    );
    // The most-denied keys: a read token may see them, no token may not.
    let top = call(admin, "GET", "/admin/v1/top-denied", &read, None).await;
    assert_eq!(top.status, 200, "{top:?}");
    assert_eq!(json_of(&top)["denials"], json!(0));
    assert_eq!(
        call(admin, "GET", "/admin/v1/top-denied", &[], None)
            .await
            .status,
        401
    );
    assert_eq!(
        call(admin, "GET", &rule_path("r"), &read, None)
            .await
            .status,
        200
    );
    assert_eq!(
        call(admin, "DELETE", &rule_path("r"), &read, None)
            .await
            .status,
        403
    );
    assert_eq!(
        call(admin, "DELETE", &rule_path("r"), &write, None)
            .await
            .status,
        204
    );
    let history = json_of(
        &call(
            admin,
            "GET",
            &format!("{}/history", rule_path("r")),
            &read,
            None,
        )
        .await,
    );
    let changes: Vec<(Value, Value)> = history["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|e| (e["change"].clone(), e["changedBy"].clone()))
        .collect();
    assert_eq!(
        changes,
        vec![
            (json!("deleted"), json!("alice")),
            (json!("created"), json!("alice"))
        ]
    );
    assert!(
        history["items"][0]["oldRule"]["capacity"] == json!(100)
            && history["items"][0]["newRule"].is_null()
    );
    // The API's description needs no token.
    let openapi = call(admin, "GET", "/admin/v1/openapi.yaml", &[], None).await;
    assert_eq!(openapi.status, 200);
    let doc: yaml_serde::Value =
        yaml_serde::from_str(&openapi.body).expect("the OpenAPI document is YAML");
    for path in [
        "/admin/v1/rate-limit-rules",
        "/admin/v1/rate-limit-rules/{id}",
        "/admin/v1/rate-limit-rules/{id}/history",
        "/admin/v1/top-denied",
        "/admin/v1/counters",
        "/admin/v1/counters/reset",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path} is documented");
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_the_admin_api_listens_on_loopback_only() {
    let pg = postgres().await;
    let settings = Settings {
        admin_listen: Some("0.0.0.0:0".parse().expect("addr")),
        ..Settings::default()
    };
    let mut node = Served::start(
        "",
        Settings {
            database_url: Some(pg.url()),
            ..settings
        },
    )
    .await;
    assert!(
        node.admin.expect("admin").ip().is_loopback(),
        "{:?}",
        node.admin
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_filter_by_domain_and_mode_and_page() {
    let pg = postgres().await;
    let mut node = Served::with_database(&pg.url(), "", Settings::default()).await;
    let admin = node.admin_port();
    for i in 0..7 {
        let (domain, mode) = if i % 2 == 0 {
            ("a", "ENFORCE")
        } else {
            ("b", "SHADOW")
        };
        let body = format!(
            r#"{{"domain":"{domain}","mode":"{mode}","algorithm":"FIXED_WINDOW","limit":5,"window":"1m"}}"#
        );
        assert_eq!(
            call(
                admin,
                "PUT",
                &rule_path(&format!("rule-{i}")),
                &[],
                Some(&body)
            )
            .await
            .status,
            201
        );
    }
    let ids = |v: &Value| {
        v["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|r| r["id"].as_str().expect("id").to_owned())
            .collect::<Vec<_>>()
    };
    let a = get_json(admin, "/admin/v1/rate-limit-rules?domain=a").await;
    assert_eq!(ids(&a), ["rule-0", "rule-2", "rule-4", "rule-6"]);
    let shadow = get_json(admin, "/admin/v1/rate-limit-rules?mode=SHADOW").await;
    assert_eq!(ids(&shadow), ["rule-1", "rule-3", "rule-5"]);
    let first = get_json(admin, "/admin/v1/rate-limit-rules?limit=3").await;
    assert_eq!(
        (ids(&first), first["next"].clone()),
        (
            vec!["rule-0".to_owned(), "rule-1".into(), "rule-2".into()],
            json!("rule-2")
        )
    );
    let second = get_json(admin, "/admin/v1/rate-limit-rules?limit=3&after=rule-2").await;
    assert_eq!(ids(&second), ["rule-3", "rule-4", "rule-5"]);
    let last = get_json(admin, "/admin/v1/rate-limit-rules?limit=3&after=rule-5").await;
    assert_eq!(
        (ids(&last), last["next"].clone()),
        (vec!["rule-6".to_owned()], Value::Null)
    );
    assert_eq!(
        call(
            admin,
            "GET",
            "/admin/v1/rate-limit-rules?mode=LOUD",
            &[],
            None
        )
        .await
        .status,
        400
    );
    assert_eq!(
        call(
            admin,
            "GET",
            "/admin/v1/rate-limit-rules?limit=0",
            &[],
            None
        )
        .await
        .status,
        400
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kill_switch_stops_enforcement_on_every_node_without_a_deploy() {
    let pg = postgres().await;
    let settings = Settings {
        default_domain: Some("public-api".into()),
        prelimit_factor: Some(0.0),
        ..Settings::default()
    };
    let (mut a, mut b) = (
        Served::with_database(&pg.url(), "", settings.clone()).await,
        Served::with_database(&pg.url(), "", settings).await,
    );
    let admin = a.admin_port();
    let strict = r#"{"match":{"plan":"gold","route":"POST /orders"},"per":["api_key"],"algorithm":"FIXED_WINDOW","limit":1,"window":"1h"}"#;
    assert_eq!(
        call(admin, "PUT", &rule_path("strict"), &[], Some(strict))
            .await
            .status,
        201
    );
    let store = RuleStore::new(&pg.url(), Duration::from_secs(2)).expect("store");
    let revision = store.revision().await.expect("revision") as u64;
    for node in [&a, &b] {
        until_revision(&node.node, revision).await;
        assert!(check(&node.node, &gold("k")).await.allowed);
        assert!(
            !check(&node.node, &gold("k")).await.allowed,
            "the rule enforces"
        );
    }
    let killed = call(
        admin,
        "PATCH",
        &rule_path("strict"),
        &[("if-match", "\"1\"")],
        Some(r#"{"mode":"DISABLED"}"#),
    )
    .await;
    assert_eq!(
        (killed.status, json_of(&killed)["mode"].clone()),
        (200, json!("DISABLED"))
    );
    let mut slowest = Duration::ZERO;
    for node in [&a, &b] {
        slowest = slowest.max(until_revision(&node.node, revision + 1).await);
        assert!(
            check(&node.node, &gold("k")).await.allowed,
            "a disabled rule enforces nothing"
        );
    }
    eprintln!("kill switch applied on both nodes within {slowest:?}");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_alone_propagates_changes() {
    let pg = postgres().await;
    let settings = Settings {
        rules_listen: Some(false),
        rules_poll_ms: Some(200),
        ..Settings::default()
    };
    let mut node = Served::with_database(&pg.url(), "", settings).await;
    let body = r#"{"domain":"api","algorithm":"FIXED_WINDOW","limit":5,"window":"1m"}"#;
    assert_eq!(
        call(
            node.admin_port(),
            "PUT",
            &rule_path("polled"),
            &[],
            Some(body)
        )
        .await
        .status,
        201
    );
    let store = RuleStore::new(&pg.url(), Duration::from_secs(2)).expect("store");
    let took = until_revision(&node.node, store.revision().await.expect("revision") as u64).await;
    eprintln!("polling every 200 ms: the change arrived after {took:?}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_down_nodes_keep_enforcing_report_staleness_and_catch_up() {
    let mut pg = postgres().await;
    let settings = Settings {
        default_domain: Some("public-api".into()),
        prelimit_factor: Some(0.0),
        rules_poll_ms: Some(100),
        ..Settings::default()
    };
    let mut node = Served::with_database(&pg.url(), "", settings).await;
    let admin = node.admin_port();
    let strict = r#"{"match":{"plan":"gold"},"per":["api_key"],"algorithm":"FIXED_WINDOW","limit":2,"window":"1h"}"#;
    assert_eq!(
        call(admin, "PUT", &rule_path("strict"), &[], Some(strict))
            .await
            .status,
        201
    );
    until_revision(&node.node, 1).await;
    let pg = tokio::task::spawn_blocking(move || {
        pg.kill();
        pg
    })
    .await
    .expect("join");
    // Still enforcing the last set.
    assert_eq!(
        support::allowed(&node.node, &gold("during-outage"), 3).await,
        2
    );
    // The admin API says the store is unavailable.
    let r = call(admin, "GET", &rule_path("strict"), &[], None).await;
    assert_eq!(
        (r.status, r.header("content-type")),
        (503, Some("application/problem+json"))
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while node.node.metrics().rules_staleness_seconds.get() < 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "staleness was never reported"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, readyz) = node.get("/readyz").await;
    assert!(readyz.contains("\"rulesStalenessSeconds\":"), "{readyz}");
    let mut pg = pg;
    let pg = tokio::task::spawn_blocking(move || {
        pg.restart().expect("restart");
        pg
    })
    .await
    .expect("join");
    // Back: a change made now reaches the node.
    let looser = strict.replace("\"limit\":2", "\"limit\":5");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let r = call(admin, "PUT", &rule_path("strict"), &[], Some(&looser)).await;
        if r.status == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the admin API did not recover: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    until_revision(&node.node, 2).await;
    assert_eq!(support::allowed(&node.node, &gold("after"), 6).await, 5);
    assert_eq!(node.node.metrics().rules_staleness_seconds.get(), 0);
    node.stop().await;
    drop(pg);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_starting_while_postgres_is_down_serves_its_snapshot() {
    let mut pg = postgres().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let snapshot = dir.path().join("rules.json");
    let settings = Settings {
        default_domain: Some("public-api".into()),
        prelimit_factor: Some(0.0),
        rules_snapshot: Some(snapshot.clone()),
        ..Settings::default()
    };
    let mut first = Served::with_database(&pg.url(), "", settings.clone()).await;
    let strict = r#"{"match":{"plan":"gold"},"per":["api_key"],"algorithm":"FIXED_WINDOW","limit":1,"window":"1h"}"#;
    assert_eq!(
        call(
            first.admin_port(),
            "PUT",
            &rule_path("strict"),
            &[],
            Some(strict)
        )
        .await
        .status,
        201
    );
    until_revision(&first.node, 1).await;
    first.stop().await;
    let url = pg.url();
    tokio::task::spawn_blocking(move || {
        pg.kill();
        drop(pg);
    })
    .await
    .expect("join");
    let mut second = Served::with_database(&url, "", settings).await;
    assert_eq!(second.node.rules().source(), "snapshot");
    assert_eq!(second.node.rules().version(), 1);
    assert_eq!(
        support::allowed(&second.node, &gold("k"), 2).await,
        1,
        "the snapshot's rule enforces"
    );
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_rules_load_and_swap() {
    let pg = postgres().await;
    let store = RuleStore::new(&pg.url(), Duration::from_secs(5)).expect("store");
    store.migrate().await.expect("migrate");
    let sql = "INSERT INTO rate_limit_rules (id, domain, match_json, per_json, algorithm, parameters, mode, fail_mode, version, updated_by)
        SELECT 'rule-' || i, 'bulk', jsonb_build_object('route', 'GET /r' || i), NULL, 'TOKEN_BUCKET',
               jsonb_build_object('capacity', 10 + i % 90, 'refillPerSecond', 1), 'ENFORCE', 'OPEN', 1, 'test'
        FROM generate_series(1, 10000) AS i;
        UPDATE rule_set_revision SET revision = revision + 1;";
    let pg = tokio::task::spawn_blocking(move || {
        pg.psql(sql).expect("bulk insert");
        pg
    })
    .await
    .expect("join");
    let start = tokio::time::Instant::now();
    let mut node = Served::with_database(&pg.url(), "", Settings::default()).await;
    let started = start.elapsed();
    assert_eq!(node.node.metrics().rules_loaded.get(), 10_000);
    let request = Request::new("bulk").descriptor([("api_key", "k"), ("route", "GET /r777")]);
    let verdict = check(&node.node, &request).await;
    assert_eq!(
        verdict.decisive().map(|s| s.rule.id.as_str()),
        Some("rule-777")
    );
    // A change reloads and swaps all 10,000.
    let swap = tokio::time::Instant::now();
    let body = r#"{"domain":"bulk","match":{"route":"GET /r777"},"algorithm":"TOKEN_BUCKET","capacity":3,"refillPerSecond":1}"#;
    assert_eq!(
        call(
            node.admin_port(),
            "PUT",
            &rule_path("rule-777"),
            &[],
            Some(body)
        )
        .await
        .status,
        200
    );
    until_revision(&node.node, 2).await;
    eprintln!(
        "10,000 rules: node started (load + compile) in {started:?}; a change swapped in after {:?}",
        swap.elapsed()
    );
    assert_eq!(
        check(&node.node, &request)
            .await
            .decisive()
            .and_then(|s| s.rule.limit())
            .map(|l| l.capacity()),
        Some(3)
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_move_between_files_and_postgres() {
    let pg = postgres().await;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = env!("CARGO_BIN_EXE_tollgate");
    let run = move |args: Vec<String>| {
        let out = std::process::Command::new(bin)
            .args(&args)
            .output()
            .expect("run tollgate");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let import = vec![
        "rules".into(),
        "import".into(),
        "--database-url".into(),
        pg.url(),
        root.join("deploy/rules/example.yaml").display().to_string(),
        root.join("deploy/rules/envoy/config.yaml")
            .display()
            .to_string(),
    ];
    let (ok, out) = tokio::task::spawn_blocking(move || run(import))
        .await
        .expect("join");
    assert!(ok, "{out}");
    assert!(
        out.contains("imported 6 rules and 1 envoyproxy/ratelimit domains"),
        "{out}"
    );
    let export_dir = dir.path().to_owned();
    let export = vec![
        "rules".into(),
        "export".into(),
        "--database-url".into(),
        pg.url(),
        "--out".into(),
        export_dir.display().to_string(),
    ];
    let (ok, out) = tokio::task::spawn_blocking(move || run(export))
        .await
        .expect("join");
    assert!(ok, "{out}");
    let original = tollgate_node::rules::source::load(&[
        root.join("deploy/rules/example.yaml"),
        root.join("deploy/rules/envoy/config.yaml"),
    ])
    .expect("original");
    let exported = tollgate_node::rules::source::load(&[dir.path().to_owned()])
        .expect("exported files are valid rules");
    let ids = |l: &tollgate_node::rules::LoadedRules| {
        let mut v: Vec<(String, String)> = l
            .native
            .iter()
            .map(|r| (r.id.clone(), format!("{:?}", r.limit)))
            .collect();
        v.sort();
        v
    };
    assert_eq!(ids(&exported), ids(&original));
    assert_eq!(exported.envoy.len(), 1);
    // An invalid file imports nothing.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "domain: d\nrules:\n  - id: x\n    algorithm: TOKEN_BUCKET\n    capacity: 0\n    refillPerSecond: 1\n").expect("write");
    let import_bad = vec![
        "rules".into(),
        "import".into(),
        "--database-url".into(),
        pg.url(),
        bad.display().to_string(),
    ];
    let (ok, out) = tokio::task::spawn_blocking(move || run(import_bad))
        .await
        .expect("join");
    assert!(
        !ok && out.contains("bad.yaml:5") && out.contains("capacity"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_apply_once() {
    let pg = postgres().await;
    let store = RuleStore::new(&pg.url(), Duration::from_secs(5)).expect("store");
    assert_eq!(
        store.migrate().await.expect("first"),
        tollgate_control::schema::MIGRATIONS.len()
    );
    assert_eq!(store.migrate().await.expect("second"), 0);
}

/// A rule written through the admin API with the id of a rule in the node's files replaces
/// the file's rule: the combined set still compiles and the stored definition enforces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_rule_replaces_the_file_rule_of_the_same_id() {
    let pg = postgres().await;
    let yaml = "domain: public-api\nrules:\n  - {id: shared, match: {plan: gold}, per: [api_key], algorithm: FIXED_WINDOW, limit: 1, window: 1h}\n";
    let settings = Settings {
        default_domain: Some("public-api".into()),
        prelimit_factor: Some(0.0),
        ..Settings::default()
    };
    let mut node = Served::with_database(&pg.url(), yaml, settings).await;
    assert_eq!(support::allowed(&node.node, &gold("file"), 3).await, 1);
    let body = r#"{"match":{"plan":"gold"},"per":["api_key"],"algorithm":"FIXED_WINDOW","limit":2,"window":"1h"}"#;
    assert_eq!(
        call(
            node.admin_port(),
            "PUT",
            &rule_path("shared"),
            &[],
            Some(body)
        )
        .await
        .status,
        201
    );
    until_revision(&node.node, 1).await;
    assert_eq!(node.node.metrics().rules_reload_errors.get(), 0);
    assert_eq!(support::allowed(&node.node, &gold("stored"), 3).await, 2);
    node.stop().await;
}

/// A stored rule may replace another, stored or in the node's files (docs/rules-precedence.md):
/// the store keeps the set whole. A name that is no rule of the domain and a circle are refused
/// (400, field `replaces`), a delete of a rule another replaces is refused (409), and the nodes
/// never see a set that fails to compile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_rules_replace_others_and_the_store_keeps_the_set_whole() {
    let pg = postgres().await;
    let yaml = "domain: public-api\nrules:\n  - {id: api-key-default, match: {api_key: \"*\"}, algorithm: FIXED_WINDOW, limit: 1, window: 1h}\n";
    let settings = Settings {
        default_domain: Some("public-api".into()),
        prelimit_factor: Some(0.0),
        ..Settings::default()
    };
    let mut node = Served::with_database(&pg.url(), yaml, settings).await;
    let admin = node.admin_port();
    let put = |id: &'static str, body: &'static str| async move {
        call(admin, "PUT", &rule_path(id), &[], Some(body)).await
    };
    let gold_body = r#"{"match":{"plan":"gold"},"per":["api_key"],"algorithm":"FIXED_WINDOW","limit":3,"window":"1h","replaces":["api-key-default"]}"#;
    let created = put("gold", gold_body).await;
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(json_of(&created)["replaces"], json!(["api-key-default"]));
    let store = RuleStore::new(&pg.url(), Duration::from_secs(2)).expect("store");
    until_revision(&node.node, store.revision().await.expect("revision") as u64).await;
    assert_eq!(
        support::allowed(&node.node, &gold("gold-key"), 5).await,
        3,
        "the gold rule decides a gold key's requests alone"
    );
    let plain = Request::new("public-api").descriptor([("api_key", "plain-key")]);
    assert_eq!(support::allowed(&node.node, &plain, 3).await, 1);

    let unknown = put(
        "typo",
        r#"{"match":{"plan":"silver"},"algorithm":"FIXED_WINDOW","limit":3,"window":"1h","replaces":["api-key-defualt"]}"#,
    )
    .await;
    assert_eq!(unknown.status, 400, "{unknown:?}");
    let problem = json_of(&unknown);
    assert_eq!(
        problem["errors"][0]["field"],
        json!("replaces"),
        "{problem}"
    );
    assert!(
        problem["errors"][0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("api-key-defualt")),
        "{problem}"
    );

    let platinum = put(
        "platinum",
        r#"{"match":{"plan":"platinum"},"algorithm":"FIXED_WINDOW","limit":9,"window":"1h","replaces":["gold"]}"#,
    )
    .await;
    assert_eq!(platinum.status, 201, "{platinum:?}");
    let circle = call(
        admin,
        "PATCH",
        &rule_path("gold"),
        &[("content-type", "application/merge-patch+json")],
        Some(r#"{"replaces":["api-key-default","platinum"]}"#),
    )
    .await;
    assert_eq!(circle.status, 400, "{circle:?}");
    let reason = json_of(&circle)["errors"][0]["reason"].to_string();
    assert!(
        reason.contains("gold → platinum → gold") || reason.contains("platinum → gold → platinum"),
        "{reason}"
    );

    let in_use = call(admin, "DELETE", &rule_path("gold"), &[], None).await;
    assert_eq!(in_use.status, 409, "{in_use:?}");
    assert!(
        json_of(&in_use)["detail"]
            .as_str()
            .is_some_and(|d| d.contains("platinum")),
        "{in_use:?}"
    );
    for id in ["platinum", "gold"] {
        let deleted = call(admin, "DELETE", &rule_path(id), &[], None).await;
        assert_eq!(deleted.status, 204, "{id}: {deleted:?}");
    }

    // Absence is stored as written.
    let anonymous = put(
        "anonymous-ip",
        r#"{"match":{"ip":"*"},"without":["api_key"],"algorithm":"FIXED_WINDOW","limit":1,"window":"1h"}"#,
    )
    .await;
    assert_eq!(anonymous.status, 201, "{anonymous:?}");
    assert_eq!(json_of(&anonymous)["without"], json!(["api_key"]));
    until_revision(&node.node, store.revision().await.expect("revision") as u64).await;
    let keyed = Request::new("public-api")
        .descriptor([("api_key", "keyed")])
        .descriptor([("ip", "203.0.113.9")]);
    let anonymous = Request::new("public-api").descriptor([("ip", "203.0.113.9")]);
    assert_eq!(
        support::allowed(&node.node, &keyed, 3).await,
        1,
        "api-key-default alone"
    );
    assert_eq!(
        support::allowed(&node.node, &anonymous, 3).await,
        1,
        "anonymous-ip"
    );
    assert_eq!(node.node.metrics().rules_reload_errors.get(), 0);
    node.stop().await;
}
