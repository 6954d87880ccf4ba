//! `tollgate check`, the binary as a user runs it, against a node on the in-memory store and
//! one on a real Redis: the decision, each descriptor's status and the headers, for a person
//! and as JSON; exit codes 0 (admitted), 1 (over the limit), 2 (not asked).

mod support;

use std::process::Output;

use support::Served;
use tollgate_server::config::Settings;

const RULES: &str = "domain: public-api\nrules:\n\
  - {id: api-key-default, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 2, refillPerSecond: 0.01}\n";

/// Runs `tollgate check` with `args` against `served`.
async fn check(served: &Served, args: &[&str]) -> Output {
    let node = served.grpc.to_string();
    let mut all = vec!["check", "--node", node.as_str()];
    all.extend_from_slice(args);
    let all: Vec<String> = all.into_iter().map(str::to_owned).collect();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(&all)
            .output()
            .expect("tollgate runs")
    })
    .await
    .expect("join")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Two admitted, then over the limit, for one key; each answer read as a person would.
async fn a_key_runs_out(served: &Served) {
    let args = ["--domain", "public-api", "api_key=k_123"];
    for left in [1, 0] {
        let out = check(served, &args).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let shown = text(&out);
        assert!(shown.starts_with("OK: admitted\n"), "{shown}");
        assert!(
            shown.contains(&format!(
                "descriptor 0 {{api_key=k_123}}: OK, {left} left (api-key-default:"
            )),
            "{shown}"
        );
        assert!(
            shown.contains("ratelimit-policy: \"api-key-default\";q=2;w=200"),
            "{shown}"
        );
    }
    let out = check(served, &args).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let shown = text(&out);
    assert!(shown.starts_with("OVER_LIMIT: denied\n"), "{shown}");
    assert!(shown.contains("retry-after: "), "{shown}");
    assert!(shown.contains("tollgate-reason: over-limit"), "{shown}");

    // For scripts: the JSON POST /json answers.
    let out = check(
        served,
        &["--domain", "public-api", "--json", "api_key=k_456"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["overallCode"], "OK", "{json}");
    assert_eq!(json["statuses"][0]["limitRemaining"], 1, "{json}");
    assert_eq!(
        json["statuses"][0]["currentLimit"]["name"], "api-key-default",
        "{json}"
    );

    // A domain no rule serves says so.
    let out = check(served, &["--domain", "nope", "api_key=k_123"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("tollgate-reason: no-rule"),
        "{}",
        text(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_asks_a_node_in_memory() {
    let mut served = Served::start(RULES, Settings::default()).await;
    a_key_runs_out(&served).await;
    // What cannot be asked is exit code 2, with the reason.
    let out = check(&served, &["--domain", "public-api", "no-equals-sign"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("is not key=value"), "{}", text(&out));
    served.stop().await;
    let out = check(&served, &["--domain", "public-api", "api_key=k"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("cannot reach the node"),
        "{}",
        text(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_asks_a_node_on_redis() {
    let redis = tokio::task::spawn_blocking(tollgate_testkit::RedisServer::start)
        .await
        .expect("join")
        .expect("redis-server");
    let mut served = Served::start(
        RULES,
        Settings {
            redis_url: Some(vec![redis.url()]),
            ..Settings::default()
        },
    )
    .await;
    a_key_runs_out(&served).await;
    served.stop().await;
}

/// The README's first screen runs as written: its `tollgate check` commands, against a node on
/// the example rules, print what the README shows (the seconds a bucket takes to refill,
/// measured to a tenth, aside).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_first_check_runs_as_written() {
    let readme = include_str!("../../../README.md");
    let console = readme
        .split("```console\n")
        .nth(1)
        .and_then(|block| block.split("\n```").next())
        .expect("the README's first console block");
    let mut served = Served::start(
        include_str!("../../../deploy/rules/example.yaml"),
        Settings::default(),
    )
    .await;
    // Each `$ tollgate check ...` and the lines it prints.
    let mut asked = 0;
    for command in console.split("$ ").skip(1) {
        let mut lines = command.lines();
        let line = lines.next().expect("a command");
        let Some(args) = line.strip_prefix("tollgate ") else {
            continue; // the alias
        };
        let expected: Vec<&str> = lines.collect();
        let mut words: Vec<&str> = args.split_whitespace().collect();
        assert_eq!(words.remove(0), "check", "{line}");
        let out = check(&served, &words).await;
        let printed = String::from_utf8_lossy(&out.stdout).into_owned();
        let tenths = |s: &str| {
            s.split(' ')
                .map(|w| {
                    if w.contains('.') && w.chars().all(|c| c.is_ascii_digit() || c == '.') {
                        "N.N"
                    } else {
                        w
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        let printed: Vec<String> = printed.lines().map(tenths).collect();
        let expected: Vec<String> = expected.iter().map(|l| tenths(l)).collect();
        assert_eq!(printed, expected, "{line}");
        asked += 1;
    }
    assert_eq!(asked, 2, "the README asks twice: {console}");
    served.stop().await;
}
