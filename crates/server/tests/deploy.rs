//! The packaging in `deploy/` against the binary it packages: every Kubernetes document
//! parses, names flags and environment variables `tollgate --help` knows, ports and probe
//! paths a node serves, and files the ConfigMap and the Secret provide; a node started with the
//! Deployment's arguments and environment (against a real Redis) answers its probes; the
//! Dockerfile copies files that exist and runs flags that exist.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tollgate_testkit::RedisServer;
use tollgate_testkit::http;
use tollgate_testkit::process::{free_port, wait_for};
use yaml_serde::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn help() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("--help")
        .output()
        .expect("tollgate --help");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every document under `deploy/kubernetes`, by kind.
fn manifests() -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let dir = repo().join("deploy/kubernetes");
    for entry in std::fs::read_dir(&dir).expect("deploy/kubernetes") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read");
        let doc: Value = yaml_serde::from_str(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
        let kind = doc["kind"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: no kind", path.display()));
        assert!(
            doc["apiVersion"].is_string(),
            "{}: no apiVersion",
            path.display()
        );
        assert!(
            doc["metadata"]["name"].is_string(),
            "{}: no name",
            path.display()
        );
        out.insert(kind.to_owned(), doc);
    }
    out
}

/// Every flag in a container's arguments and every variable of its environment is one
/// `tollgate --help` lists.
fn assert_flags_and_variables_exist(container: &Value, help: &str) {
    for arg in container["args"].as_sequence().expect("args") {
        let arg = str_of(arg);
        if arg.starts_with("--") {
            assert!(help.contains(arg), "{arg} is not a flag of tollgate");
        }
    }
    for var in container["env"].as_sequence().expect("env") {
        let name = str_of(&var["name"]);
        assert!(
            help.contains(&format!("[env: {name}=")),
            "{name} is not read by tollgate"
        );
    }
}

/// The probes ask the node's `/healthz` and `/readyz` over plain HTTP, on its `http` port, or
/// on its plaintext `probe` port when the HTTP port is TLS; and `service` targets ports the
/// container declares.
fn assert_probes_and_service_targets(container: &Value, service: &Value) {
    let probe_port = if container_ports(container).contains_key("probe") {
        "probe"
    } else {
        "http"
    };
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(
            (
                str_of(&get["path"]),
                str_of(&get["port"]),
                str_of(&get["scheme"])
            ),
            (path, probe_port, "HTTP")
        );
    }
    let ports = container_ports(container);
    for port in service["spec"]["ports"].as_sequence().expect("ports") {
        let target = str_of(&port["targetPort"]);
        assert!(ports.contains_key(target), "the Service targets {target}");
    }
}

/// The pod's container mounts `config_map` where its `--rules` points.
fn assert_rules_mounted(pod: &Value, config_map: &Value) {
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .map(str_of)
        .collect();
    let rules_at = args
        .iter()
        .position(|a| *a == "--rules")
        .map(|i| args[i + 1])
        .expect("--rules");
    let mount = container["volumeMounts"]
        .as_sequence()
        .expect("mounts")
        .iter()
        .find(|m| str_of(&m["mountPath"]) == rules_at)
        .expect("the rules are mounted where --rules points");
    let volume = pod["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mounted volume");
    assert_eq!(volume["configMap"]["name"], config_map["metadata"]["name"]);
}

/// A container's ports by name.
/// The memory the container's settings bound (the key state's budget, and the in-memory
/// store's when it names no Redis) plus the node's own 128 MiB fits its memory limit.
fn assert_memory_fits(container: &Value) {
    let env: BTreeMap<&str, &str> = container["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .filter_map(|v| Some((str_of(&v["name"]), v["value"].as_str()?)))
        .collect();
    let mb = |name: &str| -> u64 {
        env.get(name)
            .unwrap_or_else(|| panic!("{name} is not set"))
            .parse()
            .expect("MiB")
    };
    let key_state = mb("TOLLGATE_MAX_KEY_STATE_MB");
    let store = if env.contains_key("TOLLGATE_REDIS_URL") {
        0
    } else {
        mb("TOLLGATE_MEMORY_MAX_MB")
    };
    let limit = str_of(&container["resources"]["limits"]["memory"]);
    let limit_mb: u64 = match (limit.strip_suffix("Gi"), limit.strip_suffix("Mi")) {
        (Some(gi), _) => gi.parse::<u64>().expect("Gi") * 1024,
        (_, Some(mi)) => mi.parse().expect("Mi"),
        _ => panic!("memory limit {limit:?}"),
    };
    assert!(
        key_state + store + 128 <= limit_mb,
        "{key_state} MiB of key state and {store} of store do not fit {limit}"
    );
}

fn container_ports(container: &Value) -> BTreeMap<&str, u64> {
    container["ports"]
        .as_sequence()
        .expect("ports")
        .iter()
        .map(|p| {
            (
                str_of(&p["name"]),
                p["containerPort"].as_u64().expect("port"),
            )
        })
        .collect()
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v:?}"))
}

#[test]
fn the_manifests_name_what_the_node_has() {
    let docs = manifests();
    for kind in [
        "ConfigMap",
        "Secret",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "ServiceMonitor",
        "NetworkPolicy",
    ] {
        assert!(docs.contains_key(kind), "no {kind} in deploy/kubernetes");
    }
    let help = help();
    let deployment = &docs["Deployment"];
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_flags_and_variables_exist(container, &help);
    assert_memory_fits(container);
    let mut secret_keys = vec![];
    for env in container["env"].as_sequence().expect("env") {
        if let Some(key) = env["valueFrom"]["secretKeyRef"]["key"].as_str() {
            secret_keys.push(key.to_owned());
        }
    }
    let secret = &docs["Secret"]["stringData"];
    for key in &secret_keys {
        assert!(secret[key.as_str()].is_string(), "the Secret has no {key}");
    }
    // Ports: the node's defaults, named as the probes, Service and ServiceMonitor use them.
    let ports = container_ports(container);
    assert_eq!(ports.get("grpc"), Some(&8081), "{ports:?}");
    assert_eq!(ports.get("http"), Some(&8080), "{ports:?}");
    assert!(help.contains("[default: 0.0.0.0:8081]") && help.contains("[default: 0.0.0.0:8080]"));
    assert_probes_and_service_targets(container, &docs["Service"]);
    let scrape = &docs["ServiceMonitor"]["spec"]["endpoints"][0];
    assert_eq!(
        (str_of(&scrape["port"]), str_of(&scrape["path"])),
        ("http", "/metrics")
    );
    // The rules: mounted where --rules points, from the ConfigMap.
    assert_rules_mounted(pod, &docs["ConfigMap"]);
    // Everything selects the Deployment's pods.
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(&deployment["spec"]["selector"]["matchLabels"], labels);
    assert_eq!(&docs["Service"]["spec"]["selector"], labels);
    assert_eq!(
        &docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
        labels
    );
    assert_eq!(
        &docs["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"],
        labels
    );
    assert_eq!(
        str_of(&docs["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["name"]),
        str_of(&deployment["metadata"]["name"])
    );
}

/// The Deployment's container, run as a process: its arguments and environment, its rules from
/// the ConfigMap, a real Redis where it names one; it must answer its probes.
#[test]
fn a_node_started_as_the_deployment_starts_it_answers_its_probes() {
    run_as_deployed(&manifests());
}

/// Runs the Deployment in `docs` as a process (see above) and checks its probes.
fn run_as_deployed(docs: &BTreeMap<String, Value>) {
    let container = &docs["Deployment"]["spec"]["template"]["spec"]["containers"][0];
    let dir = tempfile::tempdir().expect("dir");
    for (name, text) in docs["ConfigMap"]["data"].as_mapping().expect("data") {
        std::fs::write(dir.path().join(str_of(name)), str_of(text)).expect("write");
    }
    let redis = RedisServer::start().expect("redis-server");
    let (grpc, http_port) = (
        free_port(false).expect("port"),
        free_port(false).expect("port"),
    );
    let mut command = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    let args: Vec<&str> = container["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .map(str_of)
        .collect();
    let mut args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let at = args.iter().position(|a| a == "--rules").expect("--rules") + 1;
    args[at] = dir.path().display().to_string();
    command.args(&args);
    for env in container["env"].as_sequence().expect("env") {
        let name = str_of(&env["name"]);
        let value = match (name, env["value"].as_str()) {
            ("TOLLGATE_REDIS_URL", _) => redis.url(),
            ("TOLLGATE_GRPC_LISTEN", _) => format!("127.0.0.1:{grpc}"),
            ("TOLLGATE_HTTP_LISTEN", _) => format!("127.0.0.1:{http_port}"),
            (_, Some(v)) => v.to_owned(),
            (_, None) => {
                let key = str_of(&env["valueFrom"]["secretKeyRef"]["key"]);
                str_of(&docs["Secret"]["stringData"][key]).to_owned()
            }
        };
        command.env(name, value);
    }
    let mut node = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("tollgate starts");
    let healthy = wait_for("the node's probes", Duration::from_secs(20), || {
        let live = http::get(http_port, "/healthz", &[]).ok()?;
        let ready = http::get(http_port, "/readyz", &[]).ok()?;
        (live.status == 200 && ready.status == 200).then_some(())
    });
    let metrics = http::get(http_port, "/metrics", &[]);
    let _ = node.kill();
    let _ = node.wait();
    healthy.expect("probes answer 200");
    assert_eq!(metrics.expect("metrics").status, 200);
}

#[test]
fn the_dockerfile_copies_files_that_exist_and_runs_flags_that_exist() {
    let text = std::fs::read_to_string(repo().join("deploy/Dockerfile")).expect("Dockerfile");
    let help = help();
    let mut stages = 0;
    for line in text.lines().map(str::trim) {
        if line.starts_with("FROM ") {
            stages += 1;
        }
        if let Some(rest) = line.strip_prefix("COPY ")
            && !rest.starts_with("--from")
            && !rest.starts_with(". ")
        {
            let source = rest.split_whitespace().next().expect("a source");
            assert!(repo().join(source).exists(), "COPY {source}: no such file");
        }
        if let Some(rest) = line.strip_prefix("CMD ") {
            let args: Vec<String> = serde_json::from_str(rest).expect("CMD in exec form");
            for flag in args.iter().filter(|a| a.starts_with("--")) {
                assert!(
                    help.contains(flag.as_str()),
                    "CMD {flag}: not a flag of tollgate"
                );
            }
        }
        if let Some(rest) = line.strip_prefix("EXPOSE ") {
            let ports: Vec<&str> = rest.split_whitespace().collect();
            assert_eq!(ports, ["8081", "8080"], "the node's default ports");
        }
    }
    assert_eq!(stages, 2, "a build stage and a runtime stage");
    assert!(text.contains("USER nonroot"), "runs as non-root");
    assert!(text.contains("ENTRYPOINT [\"/usr/local/bin/tollgate\"]"));
    assert!(
        text.contains("/usr/local/bin/tollgate\n"),
        "the binary is copied where ENTRYPOINT runs it"
    );
}

/// The Istio example points the gateway's rate limit filter at the Service's gRPC port, for a
/// domain the example rules define.
#[test]
fn the_istio_example_points_at_the_service() {
    let text = std::fs::read_to_string(repo().join("deploy/istio/envoyfilter.yaml")).expect("read");
    let docs: Vec<Value> = text
        .split("\n---\n")
        .map(|d| yaml_serde::from_str(d).expect("each document parses"))
        .collect();
    assert_eq!(docs.len(), 2);
    for d in &docs {
        assert_eq!(str_of(&d["kind"]), "EnvoyFilter");
    }
    let filter = &docs[0]["spec"]["configPatches"][0]["patch"]["value"];
    assert_eq!(str_of(&filter["name"]), "envoy.filters.http.ratelimit");
    let config = &filter["typed_config"];
    assert_eq!(config["failure_mode_deny"], Value::Bool(false));
    let cluster =
        str_of(&config["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"]);
    let service = &manifests()["Service"];
    let name = str_of(&service["metadata"]["name"]);
    let grpc = service["spec"]["ports"]
        .as_sequence()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == "grpc")
        .and_then(|p| p["port"].as_u64())
        .expect("a grpc port");
    assert!(
        cluster.starts_with(&format!("outbound|{grpc}||{name}.")),
        "{cluster}"
    );
    // The domain is one the example rules define.
    let domain = str_of(&config["domain"]);
    let rules = std::fs::read_to_string(repo().join("deploy/rules/example.yaml")).expect("rules");
    assert!(rules.contains(&format!("domain: {domain}")), "{domain}");
    let actions =
        &docs[1]["spec"]["configPatches"][0]["patch"]["value"]["rate_limits"][0]["actions"];
    assert_eq!(
        str_of(&actions[0]["request_headers"]["descriptor_key"]),
        "api_key"
    );
}

/// `deploy/helm/render.py`: Helm's own engine (its Go SDK, through the helm-python-sdk
/// package scripts/test installs) on the chart; stdout, or a panic with Helm's complaint.
fn helm(command: &str, values: &serde_json::Value) -> String {
    let out = Command::new("python3")
        .arg(repo().join("deploy/helm/render.py"))
        .arg(command)
        .arg(repo().join("deploy/helm/tollgate"))
        .arg(values.to_string())
        .output()
        .expect("python3 runs deploy/helm/render.py");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "helm {command} {values}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Schema-checks a YAML stream against Kubernetes 1.30's API (kubernetes-validate, strict:
/// a misspelt field fails). Custom resources (the ServiceMonitor) have no schema there.
fn validate(what: &str, yaml: &str) {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("manifests.yaml");
    std::fs::write(&file, yaml).expect("write");
    let out = Command::new("python3")
        .args([
            "-m",
            "kubernetes_validate",
            "--strict",
            "--quiet",
            "-k",
            "1.30.0",
        ])
        .arg(&file)
        .output()
        .expect("python3 -m kubernetes_validate runs (scripts/test installs it with pip)");
    assert!(
        out.status.success(),
        "{what} fails the Kubernetes schemas:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A rendered chart's documents by kind.
fn by_kind(yaml: &str) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for doc in yaml.split("\n---\n") {
        let doc: Value = yaml_serde::from_str(doc).expect("a rendered document parses");
        if let Some(kind) = doc["kind"].as_str() {
            assert!(
                out.insert(kind.to_owned(), doc.clone()).is_none(),
                "two {kind}s"
            );
        }
    }
    out
}

#[test]
fn the_plain_manifests_pass_the_kubernetes_schemas() {
    let mut stream = String::new();
    for doc in manifests().values() {
        stream.push_str(&yaml_serde::to_string(doc).expect("yaml"));
        stream.push_str("\n---\n");
    }
    validate("deploy/kubernetes", &stream);
}

/// The chart, linted and rendered by Helm for the shapes users ship (the defaults; the in-memory
/// store; everything on: PostgreSQL, two regions, TLS with both client CAs and the peer's,
/// ServiceMonitor, NetworkPolicy), schema-checked, and read as the node reads it: every
/// variable and flag is one `tollgate --help` knows, the files it names are mounted, the ports
/// it listens on are the ones declared, probed and served, Secrets hold the keys referenced,
/// and what needs a value the user must give is refused without it.
#[test]
fn the_helm_chart_renders_what_the_node_reads() {
    let help = help();
    let lint = helm("lint", &serde_json::json!({}));
    assert!(!lint.contains("[ERROR]"), "{lint}");
    let everything = serde_json::json!({
        "postgres": {"url": "postgres://tollgate@db:5432/rules"},
        "admin": {"tokens": "ops:0123456789abcdef0123", "readTokens": "view:0123456789abcdef9876"},
        "regions": {"enabled": true, "peerUrl": "https://tollgate-region.eu.example:8083", "secret": "a-shared-region-secret"},
        "tls": {"enabled": true, "grpcClientCA": true, "regionClientCA": true, "peerCA": true},
        "serviceMonitor": {"enabled": true},
        "networkPolicy": {"enabled": true},
        "autoscaling": {"enabled": false},
    });
    for values in [
        serde_json::json!({}),
        serde_json::json!({"redis": {"url": ""}}),
        everything.clone(),
    ] {
        let yaml = helm("template", &values);
        validate(&format!("the chart with {values}"), &yaml);
        let docs = by_kind(&yaml);
        let tls = values["tls"]["enabled"] == true;
        let deployment = &docs["Deployment"];
        let pod = &deployment["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        assert_flags_and_variables_exist(container, &help);
        assert_memory_fits(container);
        let mounts: Vec<(&str, &str)> = container["volumeMounts"]
            .as_sequence()
            .expect("mounts")
            .iter()
            .map(|m| (str_of(&m["name"]), str_of(&m["mountPath"])))
            .collect();
        let ports = container_ports(container);
        let mut env = BTreeMap::new();
        for var in container["env"].as_sequence().expect("env") {
            let name = str_of(&var["name"]);
            if let Some(reference) = var["valueFrom"]["secretKeyRef"].as_mapping() {
                let secret = str_of(&var["valueFrom"]["secretKeyRef"]["name"]);
                let key = str_of(&var["valueFrom"]["secretKeyRef"]["key"]);
                let optional = reference
                    .get("optional")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                let rendered = docs
                    .get("Secret")
                    .filter(|s| s["metadata"]["name"] == secret)
                    .map(|s| s["stringData"][key].is_string());
                assert!(
                    optional || rendered == Some(true),
                    "{name} reads {secret}/{key}, which the chart does not hold ({values})"
                );
            }
            if let Some(value) = var["value"].as_str() {
                env.insert(name, value);
            }
        }
        // Every file a variable names is under a mount; TLS files under the TLS Secret's.
        for (name, value) in &env {
            if value.starts_with('/') {
                let (mount, _) = mounts
                    .iter()
                    .find(|(_, at)| value.starts_with(at))
                    .unwrap_or_else(|| panic!("{name}={value}: not under a mount"));
                if name.contains("TLS") || name.ends_with("_CA") {
                    let volume = pod["volumes"]
                        .as_sequence()
                        .expect("volumes")
                        .iter()
                        .find(|v| v["name"] == *mount)
                        .expect("volume");
                    assert_eq!(str_of(&volume["secret"]["secretName"]), "tollgate-tls");
                }
            }
        }
        // Each listener's port is declared, and the Service targets declared ports.
        for (var, port) in [
            ("TOLLGATE_GRPC_LISTEN", "grpc"),
            ("TOLLGATE_HTTP_LISTEN", "http"),
            ("TOLLGATE_PROBE_LISTEN", "probe"),
            ("TOLLGATE_ADMIN_LISTEN", "admin"),
            ("TOLLGATE_REGION_LISTEN", "region"),
        ] {
            match env.get(var) {
                Some(listen) => {
                    let at: u64 = listen
                        .rsplit(':')
                        .next()
                        .and_then(|p| p.parse().ok())
                        .expect("port");
                    assert_eq!(ports.get(port), Some(&at), "{var}={listen} ({values})");
                }
                None => assert!(!ports.contains_key(port), "{port} declared, {var} unset"),
            }
        }
        assert_probes_and_service_targets(container, &docs["Service"]);
        // Probes need no TLS handshake: on the plaintext probe port when TLS is on.
        assert_eq!(ports.contains_key("probe"), tls, "{values}");
        // The rules mounted where --rules points, from the chart's ConfigMap.
        assert_rules_mounted(pod, &docs["ConfigMap"]);
        // Everything selects the Deployment's pods.
        let labels = &deployment["spec"]["selector"]["matchLabels"];
        for (key, value) in labels.as_mapping().expect("labels") {
            assert_eq!(
                &deployment["spec"]["template"]["metadata"]["labels"][key],
                value
            );
            assert_eq!(&docs["Service"]["spec"]["selector"][key], value);
        }
        if let Some(monitor) = docs.get("ServiceMonitor") {
            let scrape = &monitor["spec"]["endpoints"][0];
            assert_eq!(str_of(&scrape["path"]), "/metrics");
            assert_eq!(
                str_of(&scrape["scheme"]),
                if tls { "https" } else { "http" }
            );
        }
        assert_eq!(
            docs.contains_key("HorizontalPodAutoscaler"),
            values["autoscaling"]["enabled"] != false
        );
    }
    // What the user must give is refused without it, naming it.
    for (values, needs) in [
        (
            serde_json::json!({"regions": {"enabled": true}}),
            "regions.secret",
        ),
        (
            serde_json::json!({"postgres": {"url": "postgres://db/rules"}}),
            "admin.tokens",
        ),
    ] {
        let out = Command::new("python3")
            .arg(repo().join("deploy/helm/render.py"))
            .arg("template")
            .arg(repo().join("deploy/helm/tollgate"))
            .arg(values.to_string())
            .output()
            .expect("render.py");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(needs),
            "{values}: {stderr}"
        );
    }
}

/// The chart's Deployment at its defaults, run as a process against a real Redis: it answers
/// its probes.
#[test]
fn a_node_started_as_the_charts_deployment_answers_its_probes() {
    let docs = by_kind(&helm("template", &serde_json::json!({})));
    run_as_deployed(&docs);
}
