//! The operators' console in a real browser: headless Chromium (Debian's `chromium`, through
//! `chromium-driver`) against two real nodes on a real Redis and PostgreSQL. Support signs in,
//! disables a rule and sees it stop limiting, turns it back on; looks up a spent key, resets it
//! and sees the second node admit it; a read token sees no action and a forged POST is refused;
//! a descriptor value written as markup shows as text. Each page is saved as a screenshot at
//! 1280 px and at a phone's width (`target/tmp/console-screenshots`), and must fit the phone's
//! width without scrolling sideways.

#[path = "support/browser.rs"]
mod browser;
mod support;

use std::time::Duration;

use browser::Browser;
use support::admin::{call, json_of, postgres};
use support::{Served, allowed};
use tokio::time::Instant;
use tollgate_node::Request;
use tollgate_server::config::Settings;

/// The login rule fails closed, as the example's does: its block is read from the store (see
/// `counters.rs`).
const RULES: &str = "domain: public-api\nrules:
  - {id: per-key, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 3, refillPerSecond: 0.001}
  - {id: login, domain: auth, match: {ip: '*'}, algorithm: TOKEN_BUCKET, capacity: 2,
     refillPerSecond: 0.001, failMode: CLOSED, penalty: {after: 3, within: 1m, block: 1h}}
";

const WRITE_TOKEN: &str = "w-secret-of-16-chars";
const READ_TOKEN: &str = "r-secret-of-16-chars";
const MARKUP: &str = "<script>alert(1)</script>";

fn key(api_key: &str) -> Request {
    Request::new("public-api").descriptor([("api_key", api_key)])
}

async fn redis() -> tollgate_testkit::RedisServer {
    tokio::task::spawn_blocking(tollgate_testkit::RedisServer::start)
        .await
        .expect("join")
        .expect("redis")
}

/// Waits (up to 10 s) until one check of `request` on `node` is admitted (or denied, as
/// `admitted` says): what a change made in the console does on the nodes, as a client meets it.
async fn until_admitted(node: &tollgate_node::Node, request: &Request, admitted: bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if (allowed(node, request, 1).await == 1) == admitted {
            return;
        }
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The confirmation page asks what `asks` says; confirmed.
async fn confirm(browser: &Browser, asks: &str) {
    let question = browser.text("#question").await;
    assert!(question.contains(asks), "{question}");
    browser.click("#confirm").await;
}

/// The page after a reset or lift says what it did to `rule`.
async fn changed(browser: &Browser, rule: &str, what: &str) {
    let changes = browser.text("#changes").await;
    assert!(
        changes.contains(rule) && changes.contains(what),
        "{changes}"
    );
}

/// The pages a person sees, each screenshot at both widths; at the phone's, the page must fit.
async fn shoot(desk: &Browser, phone: &Browser, url: &str, name: &str) {
    for (browser, width) in [(desk, "1280"), (phone, "phone")] {
        browser.client.goto(url).await.expect("goto");
        browser.screenshot(&format!("{name}-{width}")).await;
    }
    assert!(
        phone.fits_width().await,
        "{name} scrolls sideways at a phone's width: {}",
        phone.page().await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn support_works_the_console_in_a_real_browser() {
    let pg = postgres().await;
    let redis = redis().await;
    let settings = Settings {
        admin_tokens: Some(vec![format!("alice:{WRITE_TOKEN}")]),
        admin_read_tokens: Some(vec![format!("dash:{READ_TOKEN}")]),
        redis_url: Some(vec![redis.url()]),
        ..Settings::default()
    };
    let mut a = Served::with_database(&pg.url(), RULES, settings.clone()).await;
    let mut b = Served::with_database(&pg.url(), RULES, settings).await;
    let admin = a.admin_port();
    let console = format!("http://127.0.0.1:{admin}/console");

    // A customer spends its bucket on node a; a key written as markup is spent and denied too.
    assert_eq!(allowed(&a.node, &key("k-spent"), 5).await, 3);
    assert_eq!(allowed(&a.node, &key(MARKUP), 5).await, 3);

    let desk = Browser::desktop(1280, 900).await;
    let phone = Browser::phone(390, 844).await;

    // Signing in: the console sends a stranger to the sign-in page; a wrong token is refused.
    for browser in [&desk, &phone] {
        browser.client.goto(&console).await.expect("goto");
        let url = browser.client.current_url().await.expect("url");
        assert_eq!(
            url.path(),
            "/console/sign-in",
            "not signed in: the sign-in page"
        );
    }
    desk.screenshot("sign-in-1280").await;
    desk.fill("#token", "not-a-token-of-this-node").await;
    desk.click("#sign-in").await;
    assert!(
        desk.text("#problem")
            .await
            .contains("not one of this node's admin tokens")
    );
    for browser in [&desk, &phone] {
        browser.fill("#token", WRITE_TOKEN).await;
        browser.click("#sign-in").await;
        assert_eq!(
            browser.text("h1").await,
            "Overview",
            "{}",
            browser.page().await
        );
    }
    assert!(desk.text(".who").await.contains("alice · may act"));
    assert_eq!(desk.text("#store .big").await, "answering");
    // The most denied keys, the markup shown as text (as /top-denied shows identities:
    // truncated).
    let denied = desk.text("#top-denied").await;
    assert!(
        denied.contains("per-key") && denied.contains("<scrip"),
        "{denied}"
    );
    shoot(&desk, &phone, &console, "overview").await;

    // The kill switch: find the rule, disable it with a reason, confirm; node a stops limiting.
    desk.client
        .goto(&format!("{console}/rules"))
        .await
        .expect("goto");
    desk.fill("#find", "per-").await;
    desk.click("#find-button").await;
    assert_eq!(desk.count("a.rule-link").await, 1, "only per-key is found");
    let found = desk.client.current_url().await.expect("url").to_string();
    shoot(&desk, &phone, &found, "rules").await;
    desk.click("a.rule-link").await;
    assert_eq!(desk.text("#rule-id").await, "per-key");
    desk.fill("#reason", "ticket 4711: cut off by mistake")
        .await;
    desk.click("#disable").await;
    desk.screenshot("confirm-1280").await;
    assert_eq!(
        allowed(&a.node, &key("k-spent"), 1).await,
        0,
        "nothing changes before it is confirmed"
    );
    confirm(&desk, "Set rule per-key to DISABLED on every node?").await;
    assert!(desk.text("#done").await.contains("within a second"));
    until_admitted(
        &a.node,
        &key("k-spent"),
        true,
        "the disabled rule stopped limiting",
    )
    .await;
    until_admitted(&b.node, &key("k-spent"), true, "on every node").await;
    desk.client
        .goto(&format!("{console}/rules/per-key"))
        .await
        .expect("goto");
    assert!(desk.text("#override").await.contains("ticket 4711"));
    assert_eq!(
        desk.text("#domain").await,
        "public-api",
        "a disabled rule still shows its domain"
    );
    let history = desk.text("#history").await;
    assert!(
        history.contains("overridden") && history.contains("alice"),
        "{history}"
    );
    shoot(&desk, &phone, &format!("{console}/rules/per-key"), "rule").await;
    // Turned back on the same way: it limits again (the bucket is still spent).
    desk.client
        .goto(&format!("{console}/rules/per-key"))
        .await
        .expect("goto");
    desk.click("#lift-override").await;
    confirm(&desk, "Lift the override of rule per-key?").await;
    assert!(desk.text("#done").await.contains("lifted"));
    until_admitted(&a.node, &key("k-spent"), false, "the rule limits again").await;

    // A customer: look the key up, see nothing remaining, reset it, see node b admit it.
    desk.client
        .goto(&format!("{console}/customer"))
        .await
        .expect("goto");
    desk.fill("#domain", "public-api").await;
    desk.fill("#descriptor", "api_key=k-spent").await;
    desk.click("#look-up").await;
    assert_eq!(desk.text("tr[data-rule='per-key'] .remaining").await, "0");
    let customer_url = desk.client.current_url().await.expect("url").to_string();
    shoot(&desk, &phone, &customer_url, "customer").await;
    desk.client.goto(&customer_url).await.expect("goto");
    desk.click("#reset-all").await;
    confirm(&desk, "Reset the counters of api_key=k-spent").await;
    changed(&desk, "per-key", "its bucket was forgotten").await;
    assert_eq!(desk.text("tr[data-rule='per-key'] .remaining").await, "3");
    desk.screenshot("customer-reset-1280").await;
    until_admitted(
        &b.node,
        &key("k-spent"),
        true,
        "node b admits the reset key",
    )
    .await;

    // A penalty block: an address that kept knocking is blocked for the hour; support sees the
    // block and its time left, and lifts it.
    let ip = Request::new("auth").descriptor([("ip", "10.0.0.9")]);
    assert_eq!(allowed(&a.node, &ip, 6).await, 2);
    desk.client
        .goto(&format!(
            "{console}/customer?domain=auth&descriptor=ip%3D10.0.0.9"
        ))
        .await
        .expect("goto");
    let penalty = desk.text("tr[data-rule='login'] .penalty").await;
    assert!(penalty.starts_with("blocked for 59 min"), "{penalty}");
    desk.screenshot("customer-blocked-1280").await;
    desk.click("tr[data-rule='login'] button.lift").await;
    confirm(&desk, "Lift the penalty blocks of ip=10.0.0.9").await;
    changed(&desk, "login", "its block was lifted").await;
    assert!(
        desk.text("tr[data-rule='login'] .penalty")
            .await
            .starts_with("not blocked")
    );

    // Markup a client sent shows as text: looked up, the value reads back as written, no
    // script ran and no element was made of it.
    desk.client
        .goto(&format!("{console}/customer"))
        .await
        .expect("goto");
    desk.fill("#domain", "public-api").await;
    desk.fill("#descriptor", &format!("api_key={MARKUP}")).await;
    desk.click("#look-up").await;
    assert_eq!(desk.text("tr[data-rule='per-key'] td.mono").await, MARKUP);
    assert_eq!(desk.text(".entries .value").await, MARKUP);
    assert_eq!(
        desk.count("script").await,
        1,
        "only the console's own script"
    );
    assert!(
        desk.client.get_alert_text().await.is_err(),
        "no alert opened"
    );
    desk.screenshot("escaping-1280").await;

    // The sessions alice's two browsers hold, to forge with below (the desk's is signed out).
    let alice = phone.session().await;
    let signed_out = desk.session().await;

    // The read token: it sees everything, and no form that acts.
    desk.client
        .goto(&format!("{console}/sign-out"))
        .await
        .expect("goto");
    assert_eq!(
        desk.client.current_url().await.expect("url").path(),
        "/console/sign-in"
    );
    desk.fill("#token", READ_TOKEN).await;
    desk.click("#sign-in").await;
    assert!(desk.text(".who").await.contains("dash · read only"));
    for page in [
        "",
        "/rules",
        "/rules/per-key",
        "/customer?domain=public-api&descriptor=api_key%3Dk-spent",
    ] {
        desk.client
            .goto(&format!("{console}{page}"))
            .await
            .expect("goto");
        assert_eq!(
            desk.count("form[method='post']").await,
            0,
            "{page}: {}",
            desk.page().await
        );
        assert_eq!(desk.count("button.act").await, 0, "{page}");
    }
    // The same counter the JSON API reads (node b spent one of the reset bucket above).
    let counters = call(
        admin,
        "GET",
        "/admin/v1/counters?domain=public-api&descriptor=api_key=k-spent",
        &[("authorization", &format!("Bearer {READ_TOKEN}"))],
        None,
    )
    .await;
    let remaining = json_of(&counters)["counters"][0]["remaining"].to_string();
    assert_eq!(
        desk.text("tr[data-rule='per-key'] .remaining").await,
        remaining
    );
    desk.screenshot("read-only-1280").await;
    let dash = desk.session().await;

    // Forged POSTs: the read session is refused by its role; alice's session without its CSRF
    // token, or from another origin, is refused; no session at all is refused. None acts.
    let disable = "action=override&mode=DISABLED&reason=forged&confirmed=yes";
    let forge = |cookie: Option<String>, origin: &'static str, body: String| async move {
        let cookie = cookie
            .map(|c| format!("tollgate-console={c}"))
            .unwrap_or_default();
        let headers = [
            ("cookie", cookie.as_str()),
            ("origin", origin),
            ("content-type", "application/x-www-form-urlencoded"),
        ];
        call(
            admin,
            "POST",
            "/console/rules/per-key/mode",
            &headers,
            Some(&body),
        )
        .await
    };
    // The test's HTTP client names the host `localhost` (no port): its own origin.
    let here = "http://localhost";
    let refused = forge(Some(dash.clone()), here, format!("csrf=x&{disable}")).await;
    assert_eq!(refused.status, 403, "{refused:?}");
    assert!(refused.body.contains("read-only"), "{}", refused.body);
    let refused = forge(Some(alice.clone()), here, disable.to_owned()).await;
    assert_eq!(refused.status, 403, "no CSRF token: {refused:?}");
    assert!(refused.body.contains("CSRF"), "{}", refused.body);
    let refused = forge(
        Some(alice.clone()),
        "http://evil.example",
        format!("csrf=x&{disable}"),
    )
    .await;
    assert_eq!(refused.status, 403, "another origin: {refused:?}");
    let refused = forge(None, here, disable.to_owned()).await;
    assert_eq!(refused.status, 401, "no session: {refused:?}");
    let refused = forge(Some(signed_out), here, disable.to_owned()).await;
    assert_eq!(refused.status, 401, "a session signed out: {refused:?}");
    let overrides = call(
        admin,
        "GET",
        "/admin/v1/mode-overrides",
        &[("authorization", &format!("Bearer {READ_TOKEN}"))],
        None,
    )
    .await;
    assert_eq!(
        json_of(&overrides)["items"],
        serde_json::json!([]),
        "nothing forged took"
    );

    desk.close().await;
    phone.close().await;
    a.stop().await;
    b.stop().await;
}

/// Without an admin token the console (as the API) listens on loopback only, and whoever
/// reaches it acts as `local`; every console answer carries the Content-Security-Policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_the_console_is_loopback_only() {
    let pg = postgres().await;
    let settings = Settings {
        admin_listen: Some("0.0.0.0:0".parse().expect("addr")),
        ..Settings::default()
    };
    let mut node = Served::start(
        RULES,
        Settings {
            database_url: Some(pg.url()),
            ..settings
        },
    )
    .await;
    let admin = node.admin.expect("admin");
    assert!(admin.ip().is_loopback(), "{admin}");
    let page = call(admin.port(), "GET", "/console", &[], None).await;
    assert_eq!(page.status, 200, "{page:?}");
    assert!(page.body.contains("local · may act"), "{}", page.body);
    let header = |name: &str| {
        page.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert!(header("content-security-policy").contains("script-src 'self'"));
    assert!(header("set-cookie").contains("HttpOnly; SameSite=Strict"));
    node.stop().await;
}

/// Signing in reads its form as every console form is read: a body past 16 KiB is refused
/// (413), and one that does not arrive within the admin port's client timeout is answered 408
/// rather than held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_in_form_too_large_or_too_slow_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pg = postgres().await;
    let mut node = Served::with_database(
        &pg.url(),
        RULES,
        Settings {
            admin_tokens: Some(vec![format!("alice:{WRITE_TOKEN}")]),
            admin_client_timeout_ms: Some(500),
            ..Settings::default()
        },
    )
    .await;
    let admin = node.admin_port();
    let large = format!("token={}", "x".repeat(20 * 1024));
    let form = [("content-type", "application/x-www-form-urlencoded")];
    let refused = call(admin, "POST", "/console/sign-in", &form, Some(&large)).await;
    assert_eq!(refused.status, 413, "{refused:?}");

    let mut slow = tokio::net::TcpStream::connect(("127.0.0.1", admin))
        .await
        .expect("connect");
    slow.write_all(
        b"POST /console/sign-in HTTP/1.1\r\nHost: localhost\r\n\
          Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\ntoken=",
    )
    .await
    .expect("write");
    let mut answer = vec![0; 4096];
    let read = tokio::time::timeout(Duration::from_secs(10), slow.read(&mut answer))
        .await
        .expect("answered, not held")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer[..read]);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    node.stop().await;
}
