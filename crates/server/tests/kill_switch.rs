//! The kill switch for every rule, wherever it came from: a mode override turns off a rule
//! from a node's rule files on every node, through the admin API and PostgreSQL, shows in the
//! rule's history and in `GET /rules`, outlives a `rules import` of the rule, and is lifted by
//! deleting it; without a database, an override file among the rule files does the same.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::admin::{call, get_json, json_of, postgres, rule_path};
use support::{Served, allowed};
use tollgate_control::RuleStore;
use tollgate_node::{Node, Request};
use tollgate_server::config::Settings;

const FILE_RULE: &str = "domain: public-api\nrules:\n  - {id: api-key-default, match: {api_key: '*'}, algorithm: FIXED_WINDOW, limit: 1, window: 1h}\n";

fn key(k: &str) -> Request {
    Request::new("public-api").descriptor([("api_key", k)])
}

/// Waits until `node` runs rule set `revision` or later.
async fn until_revision(node: &Node, revision: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while node.rules().version() < revision {
        assert!(
            tokio::time::Instant::now() < deadline,
            "revision {revision} never reached the node"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn rules_of(node: &Served) -> Value {
    let (status, body) = node.get("/rules").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("json")
}

/// `tollgate rules import` of `FILE_RULE` into the database at `url`: what it printed (it must
/// succeed).
async fn import_file_rule(url: String) -> String {
    tokio::task::spawn_blocking(move || {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("rules.yaml");
        std::fs::write(&file, FILE_RULE).expect("write");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["rules", "import", "--database-url", &url])
            .arg(&file)
            .output()
            .expect("run tollgate");
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        said
    })
    .await
    .expect("join")
}

fn override_path(id: &str) -> String {
    format!("/admin/v1/mode-overrides/{id}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kill_switch_turns_off_a_file_rule_on_every_node_and_outlives_an_import() {
    let pg = postgres().await;
    let settings = Settings {
        prelimit_factor: Some(0.0),
        ..Settings::default()
    };
    let (mut a, mut b) = (
        Served::with_database(&pg.url(), FILE_RULE, settings.clone()).await,
        Served::with_database(&pg.url(), FILE_RULE, settings).await,
    );
    let admin = a.admin_port();
    let store = RuleStore::new(&pg.url(), Duration::from_secs(2)).expect("store");
    for node in [&a, &b] {
        assert_eq!(allowed(&node.node, &key("before"), 3).await, 1, "enforced");
    }

    // Anything but the mode of a file's rule is the file's to change.
    let refused = call(
        admin,
        "PATCH",
        &rule_path("api-key-default"),
        &[],
        Some(r#"{"limit": 5}"#),
    )
    .await;
    assert_eq!(refused.status, 409, "{refused:?}");
    assert!(
        json_of(&refused)["detail"]
            .as_str()
            .is_some_and(|d| d.contains("rules.yaml") && d.contains("mode-overrides"))
    );
    let unknown = call(
        admin,
        "PATCH",
        &rule_path("no-such-rule"),
        &[],
        Some(r#"{"mode": "DISABLED"}"#),
    )
    .await;
    assert_eq!(unknown.status, 404, "{unknown:?}");

    let killed = call(
        admin,
        "PATCH",
        &rule_path("api-key-default"),
        &[],
        Some(r#"{"mode": "DISABLED"}"#),
    )
    .await;
    assert_eq!(killed.status, 200, "{killed:?}");
    assert_eq!(json_of(&killed)["mode"], "DISABLED", "{killed:?}");
    assert!(
        killed.header("tollgate-mode-override").is_some(),
        "{killed:?}"
    );
    let revision = store.revision().await.expect("revision") as u64;
    for node in [&a, &b] {
        until_revision(&node.node, revision).await;
        assert_eq!(
            allowed(&node.node, &key("killed"), 3).await,
            3,
            "the file's rule is off on every node"
        );
    }
    let effective = rules_of(&b).await;
    assert!(
        !effective["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .any(|r| r["id"] == "api-key-default"),
        "{effective}"
    );
    let shown = &effective["overrides"][0];
    assert_eq!(
        (
            shown["id"].clone(),
            shown["mode"].clone(),
            shown["ruleMode"].clone()
        ),
        (
            json!("api-key-default"),
            json!("DISABLED"),
            json!("ENFORCE")
        ),
        "{effective}"
    );
    assert!(
        shown["ruleOrigin"]
            .as_str()
            .is_some_and(|o| o.contains("rules.yaml"))
    );
    assert!(
        shown["origin"]
            .as_str()
            .is_some_and(|o| o.contains("postgres"))
    );
    let history = get_json(admin, &format!("{}/history", rule_path("api-key-default"))).await;
    assert_eq!(history["items"][0]["change"], "overridden", "{history}");
    assert_eq!(history["items"][0]["newRule"]["modeOverride"], "DISABLED");

    // An import of the rule (ENFORCE in its file) stores it, and says the override holds it.
    let said = import_file_rule(pg.url()).await;
    assert!(
        said.contains(
            "rule api-key-default: a mode override holds it DISABLED (the file says ENFORCE)"
        ),
        "{said}"
    );
    let revision = store.revision().await.expect("revision") as u64;
    until_revision(&a.node, revision).await;
    assert_eq!(
        allowed(&a.node, &key("imported"), 3).await,
        3,
        "the override outlives the import"
    );

    let lifted = call(
        admin,
        "DELETE",
        &override_path("api-key-default"),
        &[],
        None,
    )
    .await;
    assert_eq!(lifted.status, 204, "{lifted:?}");
    let again = call(
        admin,
        "DELETE",
        &override_path("api-key-default"),
        &[],
        None,
    )
    .await;
    assert_eq!(again.status, 404, "{again:?}");
    let revision = store.revision().await.expect("revision") as u64;
    for node in [&a, &b] {
        until_revision(&node.node, revision).await;
        assert_eq!(
            allowed(&node.node, &key("lifted"), 3).await,
            1,
            "enforced again"
        );
    }
    let history = get_json(admin, &format!("{}/history", rule_path("api-key-default"))).await;
    assert_eq!(
        history["items"][0]["change"], "override-lifted",
        "{history}"
    );
    a.stop().await;
    b.stop().await;
}

/// The override resource itself: a bad mode is a 400 naming the field; versions guard it like
/// a rule; an override may be set ahead of its rule, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_are_checked_versioned_and_listed() {
    let pg = postgres().await;
    let mut node = Served::with_database(&pg.url(), FILE_RULE, Settings::default()).await;
    let admin = node.admin_port();
    for body in [
        r#"{"mode": "OFF"}"#,
        r#"{"mode": ""}"#,
        r#"{"mode": "DISABLED", "until": 5}"#,
        "{}",
    ] {
        let refused = call(
            admin,
            "PUT",
            &override_path("api-key-default"),
            &[],
            Some(body),
        )
        .await;
        assert_eq!(refused.status, 400, "{body}: {refused:?}");
        assert_eq!(json_of(&refused)["status"], 400, "{refused:?}");
    }
    let set = call(
        admin,
        "PUT",
        &override_path("api-key-default"),
        &[("if-none-match", "*")],
        Some(r#"{"mode": "shadow", "reason": "INC-1"}"#),
    )
    .await;
    assert_eq!(set.status, 201, "{set:?}");
    assert_eq!(set.header("etag"), Some("\"1\""));
    assert_eq!(json_of(&set)["mode"], "SHADOW");
    let stale = call(
        admin,
        "PUT",
        &override_path("api-key-default"),
        &[("if-match", "\"7\"")],
        Some(r#"{"mode": "DISABLED"}"#),
    )
    .await;
    assert_eq!(stale.status, 412, "{stale:?}");
    let ahead = call(
        admin,
        "PUT",
        &override_path("later"),
        &[],
        Some(r#"{"mode": "DISABLED"}"#),
    )
    .await;
    assert_eq!(ahead.status, 201, "{ahead:?}");
    assert!(
        ahead
            .header("tollgate-mode-override")
            .is_some_and(|n| n.contains("applies once"))
    );
    let listed = get_json(admin, "/admin/v1/mode-overrides").await;
    let ids: Vec<&str> = listed["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|o| o["ruleId"].as_str())
        .collect();
    assert_eq!(ids, ["api-key-default", "later"], "{listed}");
    let got = call(admin, "GET", &override_path("api-key-default"), &[], None).await;
    assert_eq!(
        (got.status, json_of(&got)["reason"].clone()),
        (200, json!("INC-1"))
    );
    node.stop().await;
}

/// Without a database: an override file among the rule files turns a rule off (the rule's own
/// file untouched), and removing it turns the rule back on, both without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_file_is_the_kill_switch_without_a_database() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rules.yaml"), FILE_RULE).expect("write");
    let overrides = dir.path().join("overrides.yaml");
    std::fs::write(
        &overrides,
        "overrides:\n  - id: api-key-default\n    mode: DISABLED\n    reason: cut off a customer (INC-2)\n",
    )
    .expect("write");
    let settings = Settings {
        rules: Some(vec![dir.path().to_owned()]),
        prelimit_factor: Some(0.0),
        ..Settings::default()
    };
    let mut node = Served::start("", settings).await;
    assert_eq!(
        allowed(&node.node, &key("off"), 3).await,
        3,
        "overridden off"
    );
    let shown = rules_of(&node).await["overrides"][0].clone();
    assert_eq!(shown["reason"], "cut off a customer (INC-2)", "{shown}");
    assert!(
        shown["origin"]
            .as_str()
            .is_some_and(|o| o.contains("overrides.yaml:2"))
    );
    let version = node.node.rules().version();
    std::fs::remove_file(&overrides).expect("remove");
    until_revision(&node.node, version + 1).await;
    assert_eq!(
        allowed(&node.node, &key("on"), 3).await,
        1,
        "enforced again"
    );
    node.stop().await;
}

/// A stored rule turned off by a PATCH of the rule itself (not an override) is turned back on
/// by an import of its file, as before, but never silently: the import names the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_names_every_mode_it_changes() {
    let pg = postgres().await;
    let first = import_file_rule(pg.url()).await;
    assert!(!first.contains("mode "), "{first}");
    let mut node = Served::with_database(&pg.url(), "", Settings::default()).await;
    let off = call(
        node.admin_port(),
        "PATCH",
        &rule_path("api-key-default"),
        &[],
        Some(r#"{"mode": "DISABLED"}"#),
    )
    .await;
    assert_eq!(
        (off.status, json_of(&off)["version"].clone()),
        (200, json!(2)),
        "{off:?}"
    );
    let second = import_file_rule(pg.url()).await;
    assert!(
        second.contains("rule api-key-default: mode DISABLED -> ENFORCE (as its file says)"),
        "{second}"
    );
    node.stop().await;
}
