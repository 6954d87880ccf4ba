#!/usr/bin/env python3
"""Renders or lints a Helm chart with Helm's own Go SDK (the helm-python-sdk package, Helm v4),
as `helm template` and `helm lint` do, with no cluster. Used by the suite
(crates/server/tests/deploy.rs); scripts/test installs the package.

    render.py template CHART [VALUES_JSON]   prints the manifests (a YAML stream)
    render.py lint CHART [VALUES_JSON]       prints Helm's findings; exits 1 on an error
"""
import json
import sys

import helm_python as helm


def main(argv):
    if len(argv) not in (3, 4) or argv[1] not in ("template", "lint"):
        print(__doc__, file=sys.stderr)
        return 2
    command, chart = argv[1], argv[2]
    values = json.loads(argv[3]) if len(argv) == 4 else {}
    if command == "template":
        config = helm.Config(storage_driver="memory", namespace="tollgate")
        try:
            release = config.install(chart, "tollgate", values, namespace="tollgate", dry_run="client")
        except helm.HelmError as e:
            print(f"Error: {e}", file=sys.stderr)
            return 1
        sys.stdout.write(release["manifest"])
        return 0
    report = helm.lint(chart, values, strict=True, namespace="tollgate")
    severity = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}
    for m in report["messages"]:
        print(f"[{severity.get(m['severity'])}] {m['path']}: {m['error']}")
    return 1 if report["errors"] else 0


sys.exit(main(sys.argv))
