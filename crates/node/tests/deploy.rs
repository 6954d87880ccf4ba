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
    // Flags and environment names the binary knows.
    for arg in container["args"].as_sequence().expect("args") {
        let arg = str_of(arg);
        if arg.starts_with("--") {
            assert!(help.contains(arg), "{arg} is not a flag of tollgate");
        }
    }
    let mut secret_keys = vec![];
    for env in container["env"].as_sequence().expect("env") {
        let name = str_of(&env["name"]);
        assert!(
            help.contains(&format!("[env: {name}=")),
            "{name} is not read by tollgate"
        );
        if let Some(key) = env["valueFrom"]["secretKeyRef"]["key"].as_str() {
            secret_keys.push(key.to_owned());
        }
    }
    let secret = &docs["Secret"]["stringData"];
    for key in &secret_keys {
        assert!(secret[key.as_str()].is_string(), "the Secret has no {key}");
    }
    // Ports: the node's defaults, named as the probes, Service and ServiceMonitor use them.
    let ports: BTreeMap<&str, u64> = container["ports"]
        .as_sequence()
        .expect("ports")
        .iter()
        .map(|p| {
            (
                str_of(&p["name"]),
                p["containerPort"].as_u64().expect("port"),
            )
        })
        .collect();
    assert_eq!(ports.get("grpc"), Some(&8081), "{ports:?}");
    assert_eq!(ports.get("http"), Some(&8080), "{ports:?}");
    assert!(help.contains("[default: 0.0.0.0:8081]") && help.contains("[default: 0.0.0.0:8080]"));
    assert_eq!(
        str_of(&container["livenessProbe"]["httpGet"]["path"]),
        "/healthz"
    );
    assert_eq!(
        str_of(&container["readinessProbe"]["httpGet"]["path"]),
        "/readyz"
    );
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(str_of(&container[probe]["httpGet"]["port"]), "http");
    }
    for port in docs["Service"]["spec"]["ports"]
        .as_sequence()
        .expect("ports")
    {
        let target = str_of(&port["targetPort"]);
        assert!(ports.contains_key(target), "the Service targets {target}");
    }
    let scrape = &docs["ServiceMonitor"]["spec"]["endpoints"][0];
    assert_eq!(
        (str_of(&scrape["port"]), str_of(&scrape["path"])),
        ("http", "/metrics")
    );
    // The rules: mounted where --rules points, from the ConfigMap.
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
    assert_eq!(
        volume["configMap"]["name"],
        docs["ConfigMap"]["metadata"]["name"]
    );
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
    let docs = manifests();
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
