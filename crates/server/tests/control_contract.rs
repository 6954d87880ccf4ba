//! What the rule control plane promises, tested where it once broke, against a real
//! PostgreSQL and the real `tollgate` binary: an empty admin token is a startup error (never
//! "no authentication"); the Bearer scheme is case-insensitive; two writers creating one rule
//! at the same instant never both win, and versions are never reused; writes that change
//! nothing change nothing (imports can run on every commit); what was written is what is
//! stored; bad bytes and slow clients get clear answers; a node that cannot load its rules is
//! not ready and says why.

mod support;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use support::admin::{call, get_json, json_of, postgres, rule_path};
use support::{Served, check};
use tollgate_control::RuleStore;
use tollgate_node::Request;
use tollgate_server::config::Settings;

const BODY: &str = r#"{"domain": "api", "match": {"api_key": "*", "plan": "gold"}, "algorithm": "FIXED_WINDOW", "limit": 2, "window": "1h"}"#;

fn tollgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
}

/// Runs the binary to completion (it must exit on its own): exit code and stderr.
async fn run(mut command: Command) -> (Option<i32>, String) {
    tokio::task::spawn_blocking(move || {
        let out = command.stdin(Stdio::null()).output().expect("run tollgate");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .expect("join")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_admin_token_is_a_startup_error() {
    let pg = postgres().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("settings.yaml");
    std::fs::write(&file, "admin_tokens: [\"ops:\"]\n").expect("write");
    let base = |cmd: &mut Command| {
        cmd.args(["--database-url", &pg.url()])
            .args([
                "--grpc-listen",
                "127.0.0.1:0",
                "--http-listen",
                "127.0.0.1:0",
            ])
            .args(["--admin-listen", "0.0.0.0:0"]);
    };
    let mut flag = tollgate();
    base(&mut flag);
    flag.args(["--admin-tokens", ""]);
    let mut named = tollgate();
    base(&mut named);
    named.args(["--admin-tokens", "admin:"]);
    let mut env = tollgate();
    base(&mut env);
    env.env("TOLLGATE_ADMIN_TOKENS", "");
    let mut read_only = tollgate();
    base(&mut read_only);
    read_only.args([
        "--admin-tokens",
        "w:a-secret-long-enough",
        "--admin-read-tokens",
        ",",
    ]);
    let mut config = tollgate();
    base(&mut config);
    config.arg("--config").arg(&file);
    for (how, command) in [
        ("--admin-tokens \"\"", flag),
        ("--admin-tokens admin:", named),
        ("TOLLGATE_ADMIN_TOKENS=\"\"", env),
        ("--admin-read-tokens ,", read_only),
        ("admin_tokens: [ops:] in --config", config),
    ] {
        let (code, stderr) = run(command).await;
        assert_eq!(code, Some(2), "{how}: {stderr}");
        assert!(
            stderr.contains("empty secret") && stderr.contains("admin_"),
            "{how}: {stderr}"
        );
        assert_eq!(
            stderr.matches("empty secret").count(),
            1,
            "{how}: said once: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_case_insensitive() {
    let pg = postgres().await;
    let settings = Settings {
        admin_tokens: Some(vec!["alice:w-secret-of-16-chars".into()]),
        ..Settings::default()
    };
    let mut node = Served::with_database(&pg.url(), "", settings).await;
    let admin = node.admin_port();
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let auth = format!("{scheme} w-secret-of-16-chars");
        let r = call(
            admin,
            "GET",
            "/admin/v1/rate-limit-rules",
            &[("authorization", &auth)],
            None,
        )
        .await;
        assert_eq!(r.status, 200, "{scheme}: {r:?}");
    }
    node.stop().await;
}

/// Two PUTs creating one id at the same instant: serialized, so exactly one creates (201,
/// version 1) and the other updates it (200, version 2), and the history shows one creation.
/// With `If-None-Match: *` on both, exactly one wins and the other gets 412.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_of_one_rule_never_both_win() {
    let pg = postgres().await;
    let mut node = Served::with_database(&pg.url(), "", Settings::default()).await;
    let admin = node.admin_port();
    let put_together = |id: String, headers: Vec<(&'static str, &'static str)>| async move {
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
        let writers: Vec<_> = (0..2)
            .map(|i| {
                let (barrier, id, headers) = (barrier.clone(), id.clone(), headers.clone());
                tokio::task::spawn_blocking(move || {
                    let body = BODY.replace("\"limit\": 2", &format!("\"limit\": {}", 2 + i));
                    barrier.wait();
                    tollgate_testkit::http::request(
                        admin,
                        "PUT",
                        &rule_path(&id),
                        &headers,
                        Some(body.as_bytes()),
                    )
                    .expect("put")
                })
            })
            .collect();
        let mut out = vec![];
        for w in writers {
            out.push(w.await.expect("join"));
        }
        out
    };
    for trial in 0..15 {
        let id = format!("race-{trial}");
        let mut answers = put_together(id.clone(), vec![]).await;
        answers.sort_by_key(|r| r.status);
        let statuses: Vec<u16> = answers.iter().map(|r| r.status).collect();
        assert_eq!(statuses, vec![200, 201], "trial {trial}: {answers:?}");
        let etags: Vec<&str> = answers.iter().filter_map(|r| r.header("etag")).collect();
        assert_eq!(etags, vec!["\"2\"", "\"1\""], "trial {trial}");
        let history = get_json(admin, &format!("{}/history", rule_path(&id))).await;
        let changes: Vec<&str> = history["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter_map(|e| e["change"].as_str())
            .collect();
        assert_eq!(changes, vec!["updated", "created"], "trial {trial}");

        let id = format!("race-create-only-{trial}");
        let mut answers = put_together(id, vec![("if-none-match", "*")]).await;
        answers.sort_by_key(|r| r.status);
        let statuses: Vec<u16> = answers.iter().map(|r| r.status).collect();
        assert_eq!(statuses, vec![201, 412], "trial {trial}: {answers:?}");
    }
    node.stop().await;
}

/// A deleted and re-created rule gets a version past every one it had: a stale If-Match from
/// before the delete fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_are_never_reused_after_a_delete() {
    let pg = postgres().await;
    let mut node = Served::with_database(&pg.url(), "", Settings::default()).await;
    let admin = node.admin_port();
    let created = call(admin, "PUT", &rule_path("r"), &[], Some(BODY)).await;
    assert_eq!(created.header("etag"), Some("\"1\""));
    assert_eq!(
        call(admin, "DELETE", &rule_path("r"), &[], None)
            .await
            .status,
        204
    );
    let again = call(admin, "PUT", &rule_path("r"), &[], Some(BODY)).await;
    assert_eq!(again.status, 201);
    assert_eq!(
        again.header("etag"),
        Some("\"3\""),
        "created, deleted, created"
    );
    let stale = call(
        admin,
        "PUT",
        &rule_path("r"),
        &[("if-match", "\"1\"")],
        Some(&BODY.replace("\"limit\": 2", "\"limit\": 9")),
    )
    .await;
    assert_eq!(stale.status, 412, "{stale:?}");
    node.stop().await;
}

/// An identical PUT, and the re-import of an unchanged export, change nothing: no version, no
/// history entry, no new rule-set revision (nodes are not reloaded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_that_change_nothing_change_nothing() {
    let pg = postgres().await;
    let mut node = Served::with_database(&pg.url(), "", Settings::default()).await;
    let admin = node.admin_port();
    let store = RuleStore::new(&pg.url(), Duration::from_secs(5)).expect("store");
    assert_eq!(
        call(admin, "PUT", &rule_path("same"), &[], Some(BODY))
            .await
            .status,
        201
    );
    let revision = store.revision().await.expect("revision");
    let again = call(admin, "PUT", &rule_path("same"), &[], Some(BODY)).await;
    assert_eq!((again.status, again.header("etag")), (200, Some("\"1\"")));
    assert_eq!(store.revision().await.expect("revision"), revision);
    let history = get_json(admin, &format!("{}/history", rule_path("same"))).await;
    assert_eq!(history["items"].as_array().map(Vec::len), Some(1));
    // The same through export and import, with an envoyproxy/ratelimit domain too.
    let dir = tempfile::tempdir().expect("tempdir");
    let envoy = dir.path().join("envoy.yaml");
    std::fs::write(
        &envoy,
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n",
    )
    .expect("write");
    tollgate_control::transfer::import(&store, &[envoy], "ci", false, "default")
        .await
        .expect("import");
    let out = dir.path().join("export");
    tollgate_control::transfer::export(&store, &out)
        .await
        .expect("export");
    let revision = store.revision().await.expect("revision");
    for _ in 0..3 {
        let summary = tollgate_control::transfer::import(
            &store,
            std::slice::from_ref(&out),
            "ci",
            false,
            "default",
        )
        .await
        .expect("re-import");
        assert_eq!(
            summary.changed, 0,
            "an unchanged export re-imported changes nothing"
        );
    }
    assert_eq!(
        store.revision().await.expect("revision"),
        revision,
        "re-importing an unchanged export moved the revision"
    );
    node.stop().await;
}

/// A PUT without `per` stores no `per`: after a PATCH of `match`, the counters are keyed by
/// the new match's `*` keys, as a rule file would be, and the export writes what was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_was_written_is_what_is_stored() {
    let pg = postgres().await;
    let mut node = Served::with_database(&pg.url(), "", Settings::default()).await;
    let admin = node.admin_port();
    let created = call(admin, "PUT", &rule_path("w"), &[], Some(BODY)).await;
    assert_eq!(created.status, 201);
    assert!(json_of(&created).get("per").is_none(), "{}", created.body);
    let patched = call(
        admin,
        "PATCH",
        &rule_path("w"),
        &[],
        Some(r#"{"match": {"api_key": null, "user": "*"}}"#),
    )
    .await;
    assert_eq!(patched.status, 200, "{patched:?}");
    assert!(json_of(&patched).get("per").is_none());
    let revision = json_of(&patched)["version"].as_u64().expect("version");
    // The patched rule applies to users (no api_key in the request), two per user.
    let user = |u: &str| Request::new("api").descriptor([("user", u), ("plan", "gold")]);
    let mut allowed = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let v = check(&node.node, &user("u-probe")).await;
        if v.statuses.iter().any(|s| s.rule.id == "w") || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for _ in 0..4 {
        allowed += usize::from(check(&node.node, &user("u1")).await.allowed);
    }
    assert_eq!(
        allowed, 2,
        "the rule keys its counters by user after the PATCH (version {revision})"
    );
    let store = RuleStore::new(&pg.url(), Duration::from_secs(5)).expect("store");
    let dir = tempfile::tempdir().expect("tempdir");
    tollgate_control::transfer::export(&store, dir.path())
        .await
        .expect("export");
    let exported = std::fs::read_to_string(dir.path().join("rules.yaml")).expect("export");
    assert!(!exported.contains("per:"), "{exported}");
    assert!(exported.contains("window: 1h"), "as written: {exported}");
    node.stop().await;
}

/// A NUL in a JSON string is a 400 naming the field (not a 503 "db error"); a client that
/// sends its headers or body too slowly is dropped or answered 408, not waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bytes_and_slow_clients_get_clear_answers() {
    let pg = postgres().await;
    let settings = Settings {
        admin_client_timeout_ms: Some(300),
        ..Settings::default()
    };
    let mut node = Served::with_database(&pg.url(), "", settings).await;
    let admin = node.admin_port();
    let nul = BODY.replace("\"gold\"", "\"go\\u0000ld\"");
    let r = call(admin, "PUT", &rule_path("nul"), &[], Some(&nul)).await;
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(
        json_of(&r)["errors"][0]["field"],
        json!("match.plan"),
        "{}",
        r.body
    );
    assert_eq!(r.header("content-type"), Some("application/problem+json"));

    let slow = |partial: &'static [u8]| {
        tokio::task::spawn_blocking(move || {
            let mut stream = std::net::TcpStream::connect(("127.0.0.1", admin)).expect("connect");
            stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            stream.write_all(partial).expect("write");
            let started = std::time::SystemTime::now();
            let mut answer = Vec::new();
            let _ = stream.read_to_end(&mut answer);
            (
                started.elapsed().unwrap_or_default(),
                String::from_utf8_lossy(&answer).into_owned(),
            )
        })
    };
    // Headers never finished: the connection is closed.
    let (took, answer) = slow(b"GET /admin/v1/rate-limit-rules HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("join");
    assert!(took < Duration::from_secs(4), "held {took:?}: {answer}");
    // A body that never finishes: 408.
    let (took, answer) = slow(
        b"PUT /admin/v1/rate-limit-rules/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"domain\"",
    )
    .await
    .expect("join");
    assert!(took < Duration::from_secs(4), "held {took:?}");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    node.stop().await;
}

/// The answers item 24 asked for: POST to the collection is a problem+json 405 with Allow; an
/// unquoted If-Match is a 400; a bad query string is titled as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_preconditions_and_queries_get_their_own_problems() {
    let pg = postgres().await;
    let mut node = Served::with_database(&pg.url(), "", Settings::default()).await;
    let admin = node.admin_port();
    let post = call(admin, "POST", "/admin/v1/rate-limit-rules", &[], Some(BODY)).await;
    assert_eq!(post.status, 405, "{post:?}");
    assert_eq!(post.header("allow"), Some("GET"));
    assert_eq!(
        post.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        call(admin, "PUT", &rule_path("q"), &[], Some(BODY))
            .await
            .status,
        201
    );
    let unquoted = call(
        admin,
        "PUT",
        &rule_path("q"),
        &[("if-match", "1")],
        Some(BODY),
    )
    .await;
    assert_eq!(unquoted.status, 400, "{unquoted:?}");
    assert_eq!(json_of(&unquoted)["errors"][0]["field"], json!("If-Match"));
    let query = call(
        admin,
        "GET",
        "/admin/v1/rate-limit-rules?limit=x",
        &[],
        None,
    )
    .await;
    assert_eq!(query.status, 400);
    let body: Value = json_of(&query);
    assert_eq!(body["title"], json!("Invalid query"), "{body}");
    node.stop().await;
}

/// A node whose database does not exist (and has no snapshot) is not ready, and its log says
/// why in PostgreSQL's words; so do `tollgate rules import` and a refused connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_cannot_load_its_rules_is_not_ready_and_says_why() {
    let pg = postgres().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = format!("postgres://postgres@127.0.0.1:{}/nope", pg.port());
    let http = tollgate_testkit::process::free_port(false).expect("port");
    let mut child = tollgate()
        .args(["--database-url", &missing])
        .args(["--grpc-listen", "127.0.0.1:0"])
        .args(["--http-listen", &format!("127.0.0.1:{http}")])
        .args(["--admin-listen", "127.0.0.1:0"])
        .arg("--rules-snapshot")
        .arg(dir.path().join("none.json"))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tollgate");
    let stderr = child.stderr.take().expect("stderr");
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let log = log.clone();
        std::thread::spawn(move || {
            let mut stderr = stderr;
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                log.lock()
                    .expect("log")
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut ready = None;
    while tokio::time::Instant::now() < deadline {
        if let Ok(r) =
            tokio::task::spawn_blocking(move || tollgate_testkit::http::get(http, "/readyz", &[]))
                .await
                .expect("join")
        {
            ready = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ready = ready.expect("the node answers /readyz");
    assert_eq!(ready.status, 503, "{ready:?}");
    assert!(
        ready.body.contains("rulesProblem")
            && ready.body.contains("database \\\"nope\\\" does not exist"),
        "/readyz says why: {}",
        ready.body
    );
    let _ = child.kill();
    let _ = child.wait();
    let _ = reader.join();
    let log = log.lock().expect("log").clone();
    assert!(
        log.contains("database \"nope\" does not exist"),
        "the log names the cause: {log}"
    );
    assert!(
        !log.contains("db error\n") && !log.contains("db error\""),
        "{log}"
    );

    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, "domain: d\nrules: []\n").expect("write");
    let mut import = tollgate();
    import
        .args(["rules", "import", "--database-url", &missing])
        .arg(&rules);
    let (code, stderr) = run(import).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("database \"nope\" does not exist"),
        "{stderr}"
    );
    let closed = tollgate_testkit::process::free_port(false).expect("port");
    let mut refused = tollgate();
    refused
        .args(["rules", "import", "--database-url"])
        .arg(format!("postgres://postgres@127.0.0.1:{closed}/postgres"))
        .arg(&rules);
    let (code, stderr) = run(refused).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.to_lowercase().contains("connection refused"),
        "{stderr}"
    );
}

/// A rule that names no domain goes in the node's only domain, and the answer says so; a node
/// enforcing several domains refuses it, naming the field (such a rule used to land in a
/// domain "default" that no request names, and never matched).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_naming_no_domain_goes_in_the_only_domain_or_is_refused() {
    /// A node whose rule files enforce `domains`, on a database of its own; then a PUT of a
    /// rule naming no domain.
    async fn put_without_domain(domains: &[&str]) -> tollgate_testkit::http::Response {
        let pg = postgres().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let files = domains
            .iter()
            .map(|domain| {
                let file = dir.path().join(format!("{domain}.yaml"));
                std::fs::write(
                    &file,
                    format!("domain: {domain}\nrules:\n  - {{id: {domain}-plans, match: {{plan: '*'}}, algorithm: FIXED_WINDOW, limit: 5, window: 1m}}\n"),
                )
                .expect("write");
                file
            })
            .collect();
        let settings = Settings {
            rules: Some(files),
            ..Settings::default()
        };
        let mut node = Served::with_database(&pg.url(), "", settings).await;
        let answer = call(
            node.admin_port(),
            "PUT",
            &rule_path("no-domain"),
            &[("content-type", "application/json")],
            Some(r#"{"match": {"api_key": "*"}, "algorithm": "FIXED_WINDOW", "limit": 2, "window": "1h"}"#),
        )
        .await;
        node.stop().await;
        answer
    }

    let created = put_without_domain(&["public-api"]).await;
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(json_of(&created)["domain"], json!("public-api"));
    assert!(
        created
            .header("tollgate-domain-defaulted")
            .is_some_and(|v| v.contains("public-api")),
        "{created:?}"
    );

    let refused = put_without_domain(&["public-api", "internal"]).await;
    assert_eq!(refused.status, 400, "{refused:?}");
    let problem = json_of(&refused);
    assert!(
        problem.to_string().contains("domain") && problem.to_string().contains("is required"),
        "{problem}"
    );
}

/// Imports and exports on a database whose schema exists log no PostgreSQL NOTICE ("relation
/// … already exists, skipping" used to be logged by every one of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imports_and_exports_log_no_notices() {
    let pg = postgres().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "domain: d\nrules:\n  - {id: r, match: {plan: '*'}, algorithm: FIXED_WINDOW, limit: 5, window: 1m}\n",
    )
    .expect("write");
    let out = dir.path().join("export");
    for round in 0..2 {
        for (command, rest) in [
            ("import", vec![rules.as_os_str()]),
            ("export", vec!["--out".as_ref(), out.as_os_str()]),
        ] {
            let mut rules_command = tollgate();
            rules_command
                .env("RUST_LOG", "info")
                .args(["rules", command, "--database-url", &pg.url()])
                .args(&rest);
            let (code, stderr) = run(rules_command).await;
            assert_eq!(code, Some(0), "{command:?}, round {round}: {stderr}");
            assert!(
                !stderr.contains("already exists") && !stderr.contains("NOTICE"),
                "{command:?}, round {round}: {stderr}"
            );
        }
    }
}

/// `GET /rules` on the HTTP port shows the rules the node enforces, from its files and from
/// PostgreSQL together, each with where it came from and its mode; a rule turned off with the
/// kill switch leaves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_effective_rules_show_files_and_stored_rules_with_their_origin() {
    let pg = postgres().await;
    let mut node = Served::with_database(
        &pg.url(),
        "domain: api\nrules:\n  - {id: from-file, match: {plan: '*'}, algorithm: FIXED_WINDOW, limit: 5, window: 1m}\n",
        Settings::default(),
    )
    .await;
    let stored = call(
        node.admin_port(),
        "PUT",
        &rule_path("stored"),
        &[],
        Some(BODY),
    )
    .await;
    assert_eq!(stored.status, 201, "{stored:?}");
    let rules_now = async |node: &Served| -> Value {
        let (status, body) = node.get("/rules").await;
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).expect("json")
    };
    let rule = |rules: &Value, id: &str| {
        rules["rules"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["id"] == id).cloned())
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let rules = loop {
        let rules = rules_now(&node).await;
        if rule(&rules, "stored").is_some() {
            break rules;
        }
        assert!(tokio::time::Instant::now() < deadline, "{rules}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let file = rule(&rules, "from-file").expect("the file's rule");
    assert!(
        file["origin"]
            .as_str()
            .is_some_and(|o| o.contains("rules.yaml:3")),
        "{file}"
    );
    let stored = rule(&rules, "stored").expect("the stored rule");
    assert!(
        stored["origin"]
            .as_str()
            .is_some_and(|o| o.contains("postgres")),
        "{stored}"
    );
    assert_eq!(
        (stored["mode"].clone(), stored["limit"]["capacity"].clone()),
        (json!("ENFORCE"), json!(2))
    );
    assert_eq!(rules["source"], "postgres", "{rules}");

    let off = call(
        node.admin_port(),
        "PATCH",
        &rule_path("stored"),
        &[],
        Some(r#"{"mode": "DISABLED"}"#),
    )
    .await;
    assert_eq!(off.status, 200, "{off:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while rule(&rules_now(&node).await, "stored").is_some() {
        assert!(tokio::time::Instant::now() < deadline, "still in effect");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    node.stop().await;
}

/// A rule wrong in three fields is refused with all three in `errors[]`, each naming its
/// field, not only the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_wrong_in_three_fields_names_all_three() {
    let pg = postgres().await;
    let mut node = Served::with_database(&pg.url(), "", Settings::default()).await;
    let refused = call(
        node.admin_port(),
        "PUT",
        &rule_path("wrong"),
        &[],
        Some(r#"{"domain": "api", "algorithm": "TOKEN_BUCKET", "capacity": 0, "refillPerSecond": 1, "mode": "OFF", "failMode": "SOMETIMES"}"#),
    )
    .await;
    assert_eq!(refused.status, 400, "{refused:?}");
    let problem = json_of(&refused);
    let fields: Vec<&str> = problem["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .filter_map(|e| e["field"].as_str())
        .collect();
    assert_eq!(fields, ["capacity", "mode", "failMode"], "{problem}");
    node.stop().await;
}
