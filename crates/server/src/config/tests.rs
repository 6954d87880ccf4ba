use super::*;

#[test]
fn hashed_identities_need_a_secret_and_the_top_denied_token_a_length() {
    let field = |settings: Settings| {
        Config::try_from(settings)
            .map(|_| ())
            .expect_err("refused")
            .first()
            .field
            .clone()
    };
    let hashed = |secret: Option<&str>| Settings {
        top_denied_identities: Some("hashed".into()),
        top_denied_secret: secret.map(String::from),
        ..Settings::default()
    };
    assert_eq!(field(hashed(None)), "top_denied_identities");
    assert_eq!(field(hashed(Some("short"))), "top_denied_identities");
    assert!(Config::try_from(hashed(Some("sixteen-bytes-long"))).is_ok());
    let token = Settings {
        top_denied_token: Some("short".into()),
        ..Settings::default()
    };
    assert_eq!(field(token), "top_denied_token");
}

#[test]
fn flags_override_the_file_and_defaults_fill_the_rest() {
    let file: Settings =
        yaml_serde::from_str("store_timeout_ms: 9\nlease_max_units: 20\n").expect("yaml");
    let cli = Cli::try_parse_from([
        "tollgate",
        "--lease-max-units",
        "30",
        "--redis-url",
        "redis://a:1/,redis://b:2/",
        "--redis-cluster",
    ])
    .expect("flags");
    let config = Config::try_from(cli.settings.or(file)).expect("valid");
    assert_eq!(config.store_timeout, Duration::from_millis(9));
    assert_eq!(config.runtime.lease.max_units, 30);
    let redis = config.redis.expect("redis");
    assert_eq!(redis.urls.len(), 2);
    assert!(redis.cluster);
    assert_eq!(config.grpc_listen.port(), 8081);
    assert_eq!(config.worker_threads, available_cpus());
}

#[test]
fn unset_settings_are_the_runtime_defaults() {
    let config = Config::try_from(Settings::default()).expect("valid");
    let defaults = RuntimeConfig::default();
    let (got, want) = (&config.runtime, &defaults);
    assert_eq!(got.lease.max_units, want.lease.max_units);
    assert_eq!(got.lease.ttl, want.lease.ttl);
    assert_eq!(got.lease.max_share, want.lease.max_share);
    assert_eq!(got.store_patience, want.store_patience);
    assert_eq!(got.startup_patience, want.startup_patience);
    assert_eq!(got.prelimit_factor, want.prelimit_factor);
    assert_eq!(got.cluster_nodes, want.cluster_nodes);
    assert_eq!(got.max_key_state_bytes, want.max_key_state_bytes);
    assert_eq!(got.idle_timeout, want.idle_timeout);
    assert_eq!(got.top_denied, want.top_denied);
    assert_eq!(got.breaker.window, want.breaker.window);
    assert_eq!(got.breaker.min_calls, want.breaker.min_calls);
    assert_eq!(got.breaker.cooldown, want.breaker.cooldown);
    assert_eq!(got.breaker.max_cooldown, want.breaker.max_cooldown);
    assert_eq!(
        config.memory_max_bytes,
        tollgate_lease::MemoryConfig::default().max_bytes
    );
}

#[test]
fn worker_threads_default_to_the_cpus_given_and_zero_means_default() {
    let threads = |args: &[&str]| {
        let cli = Cli::try_parse_from([&["tollgate"], args].concat()).expect("flags");
        Config::try_from(cli.settings).map(|c| c.worker_threads)
    };
    assert_eq!(threads(&["--worker-threads", "1"]).expect("valid"), 1);
    assert_eq!(threads(&["--worker-threads", "3"]).expect("valid"), 3);
    assert_eq!(
        threads(&["--worker-threads", "0"]).expect("valid"),
        available_cpus()
    );
    assert_eq!(
        threads(&["--worker-threads", "4096"])
            .expect_err("too many")
            .first()
            .field,
        "worker_threads"
    );
}

#[test]
fn bad_settings_name_their_field() {
    let err = |args: &[&str]| {
        let cli = Cli::try_parse_from([&["tollgate"], args].concat()).expect("flags");
        Config::try_from(cli.settings)
            .expect_err("invalid")
            .first()
            .field
            .clone()
    };
    assert_eq!(err(&["--lease-max-share", "1.5"]), "lease_max_share");
    assert_eq!(err(&["--store-timeout-ms", "0"]), "store_timeout_ms");
    assert_eq!(err(&["--redis-batch-max", "0"]), "redis_batch_max");
    assert_eq!(err(&["--redis-batch-max", "5000"]), "redis_batch_max");
    assert_eq!(err(&["--rlqs-max-state-mb", "0"]), "rlqs_max_state_mb");
    assert_eq!(err(&["--rlqs-max-report-mb", "65"]), "rlqs_max_report_mb");
    assert_eq!(err(&["--log-format", "xml"]), "log_format");
    assert_eq!(err(&["--prelimit-factor=-1"]), "prelimit_factor");
    assert_eq!(err(&["--region", "us"]), "peer_region");
    assert_eq!(err(&["--region", "us", "--peer-region", "eu"]), "peer_url");
    let region = [
        "--region",
        "us",
        "--peer-region",
        "eu",
        "--peer-url",
        "http://eu:8083",
    ];
    assert_eq!(err(&region), "region_secret");
    let with = |extra: &[&str]| {
        let mut args = region.to_vec();
        args.extend(["--region-secret", "0123456789abcdef"]);
        args.extend(extra);
        err(&args)
    };
    assert_eq!(with(&["--region-share", "1.5"]), "region_share");
    assert_eq!(
        with(&["--region-sync-interval-ms", "0"]),
        "region_sync_interval_ms"
    );
    // TLS: a certificate needs its key and the reverse; mutual TLS needs TLS; an https
    // peer needs the CA that signs it, and a peer CA an https peer.
    assert_eq!(err(&["--tls-cert", "cert.pem"]), "tls_key");
    assert_eq!(err(&["--tls-key", "key.pem"]), "tls_cert");
    assert_eq!(err(&["--grpc-client-ca", "ca.pem"]), "grpc_client_ca");
    assert_eq!(err(&["--region-client-ca", "ca.pem"]), "region_client_ca");
    assert_eq!(with(&["--peer-ca", "ca.pem"]), "peer_url");
    let mut https = region.to_vec();
    https[5] = "https://eu:8083";
    https.extend(["--region-secret", "0123456789abcdef"]);
    assert_eq!(err(&https), "peer_ca");
    https.extend(["--peer-ca", "/nonexistent/ca.pem"]);
    assert_eq!(err(&https), "peer_ca");
    let unknown = yaml_serde::from_str::<Settings>("lease_max_unit: 3\n").expect_err("unknown");
    assert!(unknown.to_string().contains("lease_max_unit"), "{unknown}");
}

/// Each option of `tollgate --help` that shows a default, with the default it shows.
fn shown_defaults() -> Vec<(String, String)> {
    use clap::CommandFactory;
    let help = Cli::command().render_long_help().to_string();
    let mut shown = Vec::new();
    let mut option = None;
    for line in help.lines().map(str::trim) {
        if let Some(flag) = line.strip_prefix("--") {
            option = flag.split([' ', '=']).next().map(String::from);
        } else if let (Some(name), Some((_, rest))) = (&option, line.split_once("[default: ")) {
            let value = rest.split(']').next().unwrap_or_default();
            shown.push((name.clone(), value.to_owned()));
            option = None;
        }
    }
    shown
}

#[test]
fn every_default_help_shows_is_its_constant() {
    let ms = |d: Duration| d.as_millis().to_string();
    let mib = |bytes: usize| (bytes >> 20).to_string();
    let constants = [
        ("grpc-listen", defaults::GRPC_LISTEN.to_string()),
        ("http-listen", defaults::HTTP_LISTEN.to_string()),
        ("rules-reload-ms", ms(defaults::RULES_RELOAD)),
        ("envoy-fail-mode", defaults::ENVOY_FAIL_MODE.to_owned()),
        ("redis-cluster", defaults::REDIS_CLUSTER.to_string()),
        ("redis-batch-max", defaults::REDIS_BATCH_MAX.to_string()),
        ("store-timeout-ms", ms(defaults::STORE_TIMEOUT)),
        ("lease-max-units", defaults::LEASE_MAX_UNITS.to_string()),
        ("lease-ttl-ms", ms(defaults::LEASE_TTL)),
        ("store-patience-ms", ms(defaults::STORE_PATIENCE)),
        (
            "store-startup-patience-ms",
            ms(defaults::STORE_STARTUP_PATIENCE),
        ),
        ("lease-max-share", defaults::LEASE_MAX_SHARE.to_string()),
        ("prelimit-factor", defaults::PRELIMIT_FACTOR.to_string()),
        ("cluster-nodes", defaults::CLUSTER_NODES.to_string()),
        ("max-key-state-mb", mib(defaults::MAX_KEY_STATE_BYTES)),
        ("idle-timeout-ms", ms(defaults::IDLE_TIMEOUT)),
        ("breaker-min-calls", defaults::BREAKER_MIN_CALLS.to_string()),
        (
            "breaker-failure-ratio",
            defaults::BREAKER_FAILURE_RATIO.to_string(),
        ),
        ("breaker-window-ms", ms(defaults::BREAKER_WINDOW)),
        ("breaker-cooldown-ms", ms(defaults::BREAKER_COOLDOWN)),
        (
            "breaker-max-cooldown-ms",
            ms(defaults::BREAKER_MAX_COOLDOWN),
        ),
        ("memory-max-mb", mib(defaults::MEMORY_MAX_BYTES)),
        ("log-format", defaults::LOG_FORMAT.to_owned()),
        (
            "trace-sample-ratio",
            defaults::TRACE_SAMPLE_RATIO.to_string(),
        ),
        (
            "top-denied-identities",
            defaults::TOP_DENIED_IDENTITIES.to_owned(),
        ),
        (
            "descriptor-overrides",
            defaults::DESCRIPTOR_OVERRIDES.to_owned(),
        ),
        ("json-check", defaults::JSON_CHECK.to_string()),
        (
            "x-ratelimit-headers",
            defaults::X_RATELIMIT_HEADERS.to_string(),
        ),
        ("rlqs-max-state-mb", defaults::RLQS_MAX_STATE_MB.to_string()),
        (
            "rlqs-max-report-mb",
            defaults::RLQS_MAX_REPORT_MB.to_string(),
        ),
        ("admin-listen", defaults::ADMIN_LISTEN.to_string()),
        (
            "admin-client-timeout-ms",
            ms(defaults::ADMIN_CLIENT_TIMEOUT),
        ),
        ("rules-poll-ms", ms(defaults::RULES_POLL)),
        ("rules-listen", defaults::RULES_LISTEN.to_string()),
        ("rules-snapshot", defaults::RULES_SNAPSHOT.to_owned()),
        ("region-listen", defaults::REGION_LISTEN.to_string()),
        ("region-share", defaults::REGION_SHARE.to_string()),
        (
            "region-sync-interval-ms",
            ms(defaults::REGION_SYNC_INTERVAL),
        ),
        ("region-heartbeat-ms", ms(defaults::REGION_HEARTBEAT)),
        (
            "region-failover-after-ms",
            ms(defaults::REGION_FAILOVER_AFTER),
        ),
        (
            "region-failback-after-ms",
            ms(defaults::REGION_FAILBACK_AFTER),
        ),
        (
            "region-forward-deadline-ms",
            ms(defaults::REGION_FORWARD_DEADLINE),
        ),
        ("tls-reload-ms", ms(defaults::TLS_RELOAD)),
    ];
    let constants: Vec<(String, String)> = constants
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
    assert_eq!(shown_defaults(), constants);
}

#[test]
fn giving_the_default_help_shows_changes_nothing() {
    // Every area on, so every setting is read.
    let on = [
        "--redis-url=redis://a:1/",
        "--otlp-endpoint=http://collector:4317",
        "--database-url=postgres://control/rules",
        "--tls-cert=cert.pem",
        "--tls-key=key.pem",
        "--region=us",
        "--peer-region=eu",
        "--peer-url=http://eu:8083",
        "--region-secret=0123456789abcdef",
    ];
    let config = |extra: Option<String>| {
        let args = ["tollgate"].into_iter().chain(on).map(String::from);
        let cli = Cli::try_parse_from(args.chain(extra)).expect("flags");
        format!("{:?}", Config::try_from(cli.settings).expect("valid"))
    };
    let unset = config(None);
    let shown = shown_defaults();
    assert!(shown.len() > 30, "{shown:?}");
    for (name, value) in shown {
        let given = config(Some(format!("--{name}={value}")));
        assert_eq!(given, unset, "--{name}={value}");
    }
}

#[test]
fn every_bad_setting_is_named_in_one_run() {
    // One bad value for each; several in one area (store_timeout_ms and redis_batch_max).
    let bad = [
        ("--store-timeout-ms=0", "store_timeout_ms"),
        ("--redis-batch-max=0", "redis_batch_max"),
        ("--lease-max-share=2", "lease_max_share"),
        ("--lease-max-units=0", "lease_max_units"),
        ("--lease-ttl-ms=1", "lease_ttl_ms"),
        ("--prelimit-factor=-1", "prelimit_factor"),
        ("--cluster-nodes=0", "cluster_nodes"),
        ("--log-format=xml", "log_format"),
        ("--otlp-endpoint=ftp://collector", "otlp_endpoint"),
        ("--top-denied-identities=bogus", "top_denied_identities"),
        ("--descriptor-overrides=maybe", "descriptor_overrides"),
        ("--top-denied-token=short", "top_denied_token"),
        ("--breaker-failure-ratio=0", "breaker_failure_ratio"),
        ("--store-patience-ms=70000", "store_patience_ms"),
        (
            "--store-startup-patience-ms=700000",
            "store_startup_patience_ms",
        ),
        ("--admin-tokens=ops:", "admin_tokens"),
        ("--tls-cert=cert.pem", "tls_key"),
        ("--region=us", "peer_region"),
        ("--envoy-fail-mode=edge=MAYBE", "envoy_fail_mode"),
        ("--worker-threads=5000", "worker_threads"),
    ];
    let args = bad.iter().map(|(arg, _)| *arg);
    let cli = Cli::try_parse_from(["tollgate"].into_iter().chain(args)).expect("flags");
    let errors = Config::try_from(cli.settings).expect_err("invalid");
    let mut named: Vec<&str> = errors.0.iter().map(|e| e.field.as_str()).collect();
    let mut expected: Vec<&str> = bad.iter().map(|(_, field)| *field).collect();
    named.sort_unstable();
    expected.sort_unstable();
    assert_eq!(named, expected, "{errors}");
}

/// issue 48: a settings file with three mistakes (an unknown setting, a value of the wrong
/// type, a value out of range) gets three errors in one run; `rules:` takes a list or the
/// flag's comma-separated string.
#[test]
fn a_settings_file_says_every_mistake_at_once() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("tollgate.yaml");
    std::fs::write(
        &path,
        "grpc_listen: 127.0.0.1:8081\nlease_ttl_msec: 500\nstore_timeout_ms: soon\nrules: a.yaml\n",
    )
    .expect("write");
    let errors = Settings::from_file(&path).expect_err("two unreadable");
    let fields: Vec<&str> = errors.0.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["lease_ttl_msec", "store_timeout_ms"], "{errors}");
    assert!(
        errors.to_string().contains("did you mean `lease_ttl_ms`"),
        "{errors}"
    );
    // The third mistake is a value out of range, found when the settings are read.
    std::fs::write(
        &path,
        "lease_ttl_msec: 500\nstore_timeout_ms: soon\njson_check_token: short\n",
    )
    .expect("write");
    let cli = Cli::try_parse_from(["tollgate", "--config", path.to_str().expect("utf-8")])
        .expect("flags");
    let errors = cli.resolve().expect_err("three mistakes");
    let fields: Vec<&str> = errors.0.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        ["lease_ttl_msec", "store_timeout_ms", "json_check_token"],
        "{errors}"
    );
    for rules in ["rules: a.yaml, b.yaml\n", "rules: [a.yaml, b.yaml]\n"] {
        std::fs::write(&path, rules).expect("write");
        let settings = Settings::from_file(&path).expect("both forms");
        assert_eq!(
            settings.rules,
            Some(vec!["a.yaml".into(), "b.yaml".into()]),
            "{rules}"
        );
    }
}

/// Every constraint a setting has is in `--help`.
#[test]
fn help_says_every_constraint() {
    use clap::CommandFactory;
    let help = Cli::command().render_long_help().to_string();
    let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
    for (flag, says) in [
        ("--json-check-token", "at least 16 characters"),
        ("--top-denied-token", "at least 16 characters"),
        ("--top-denied-secret", "at least 16 bytes"),
        ("--region-secret", "at least 16 characters"),
        ("--lease-ttl-ms", "10 to 3600000"),
        ("--redis-batch-max", "1 to 1024"),
        ("--rlqs-max-state-mb", "1 to 4096"),
        ("--rlqs-max-report-mb", "1 to 64"),
        ("--worker-threads", "at most 1024"),
        ("--store-startup-patience-ms", "at most 600000"),
        ("--default-domain", "1 to 64 characters"),
        ("--region-share", "above 0 and at most 1"),
    ] {
        let at = flat
            .find(&format!("{flag} <"))
            .unwrap_or_else(|| panic!("{flag} in --help"));
        let own = &flat[at..];
        let next = own[flag.len()..]
            .find(" --")
            .map_or(own.len(), |n| n + flag.len());
        assert!(own[..next].contains(says), "{flag}: {}", &own[..next]);
    }
}
