"""The operator-facing assets in deploy/: Prometheus config and alert rules,
the Grafana dashboard and the Kubernetes manifests.

- promtool checks the scrape config and the rules, and runs the rules' unit
  tests (deploy/prometheus/flagosd-alerts.test.yml); the dashboard's queries
  must parse as PromQL too.
- The Kubernetes manifests are validated against Kubernetes' own schemas
  (kubernetes-validate, offline), and the fields that tie them together are
  checked: the socket directory, the metrics port, the probes, the devices,
  the Service and the ServiceMonitor.
- Every metric the dashboard and the rules name must be one that a real
  flagosd exports: a daemon is started with metrics on, given some work
  (including errors, an out-of-memory refusal and a refused session), and
  scraped (test_scrape_*; `-k "not scrape"` leaves it out).

promtool comes from $PROMTOOL, else PATH, else <repo>/.tools/prometheus
(scripts/bootstrap unpacks Debian's prometheus package there).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flagos_test_env import REPO, run_backend

DEPLOY = REPO / "deploy"
PROMETHEUS = DEPLOY / "prometheus"
PROMETHEUS_CONFIG = PROMETHEUS / "prometheus.yml"
ALERT_RULES = PROMETHEUS / "flagosd-alerts.yml"
ALERT_TESTS = PROMETHEUS / "flagosd-alerts.test.yml"
DASHBOARD = DEPLOY / "grafana" / "flagosd-dashboard.json"
KUBERNETES = DEPLOY / "kubernetes"
DAEMONSET = KUBERNETES / "flagosd-daemonset.yaml"
SERVICE = KUBERNETES / "flagosd-service.yaml"
SERVICE_MONITOR = KUBERNETES / "flagosd-servicemonitor.yaml"
WORKLOAD = KUBERNETES / "example-workload.yaml"
TRAINING_JOB = KUBERNETES / "training-job.yaml"

SOCKET_DIR = "/run/flagosd"
SOCKET_ENDPOINT = "unix:///run/flagosd/flagosd.sock"
METRICS_PORT = 9400

# Exported only by the kunlunxin backend when flagosd loaded the vendor's
# management library (libxpuml): a cpu-backend daemon never has them. They
# may be missing from the scrape; where present (the kunlunxin pass, over the
# fake libxpurt and libxpuml) they are checked like the others.
VENDOR_TELEMETRY_METRICS = frozenset({
    "flagosd_device_temperature_celsius",
    "flagosd_device_power_watts",
    "flagosd_device_utilization_ratio",
    "flagosd_device_reported_memory_total_bytes",
    "flagosd_device_reported_memory_used_bytes",
})
# Labels Prometheus adds to every scraped series (and that the ServiceMonitor
# relabels), not flagosd.
TARGET_LABELS = frozenset({"instance", "job", "node"})
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

# Kubernetes versions whose schemas the manifests must satisfy: an old one
# still in wide use, and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.28.0", None)


# ------------------------------------------------------------------ helpers


def promtool() -> str:
    candidates = [os.environ.get("PROMTOOL"), shutil.which("promtool"),
                  str(REPO / ".tools" / "prometheus" / "usr" / "bin" / "promtool")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("no promtool: set PROMTOOL, put promtool on PATH, or run scripts/bootstrap "
                "(it unpacks Debian's prometheus package into .tools/prometheus)")


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO, stdin=subprocess.DEVNULL)


def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def the_object(path: Path, kind: str) -> dict[str, Any]:
    found = [doc for doc in load_yaml_documents(path) if doc.get("kind") == kind]
    assert len(found) == 1, f"{path.name}: expected one {kind}, found {len(found)}"
    return found[0]


def dashboard() -> dict[str, Any]:
    with open(DASHBOARD) as f:
        return json.load(f)


def iter_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from iter_panels(panel.get("panels", []))  # collapsed rows hold theirs


def dashboard_expressions() -> list[tuple[str, str]]:
    """(where, PromQL) for every query in the dashboard: panels, variables, annotations."""
    board = dashboard()
    found: list[tuple[str, str]] = []
    for panel in iter_panels(board.get("panels", [])):
        for target in panel.get("targets", []):
            if target.get("expr"):
                found.append((f"panel {panel.get('title')!r} {target.get('refId')}",
                              target["expr"]))
    for variable in board.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if query:
            found.append((f"variable ${variable['name']}", query))
    for annotation in board.get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            found.append((f"annotation {annotation.get('name')!r}", annotation["expr"]))
    return found


def rule_expressions() -> list[tuple[str, str]]:
    with open(ALERT_RULES) as f:
        rules = yaml.safe_load(f)
    return [(f"rule {rule.get('alert') or rule.get('record')}", rule["expr"])
            for group in rules["groups"] for rule in group["rules"]]


# Grafana's variables, as the dashboard would expand them.
GRAFANA_VARIABLES = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h",
                     "instance": ".*", "device": ".*"}


def expand_grafana_variables(expr: str) -> str:
    def value(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        assert name in GRAFANA_VARIABLES, f"unknown dashboard variable ${name} in {expr!r}"
        return GRAFANA_VARIABLES[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", value, expr)


def label_values_metric(expr: str) -> str | None:
    """label_values(metric{...}, label) -> metric{...}; label_values(label) -> None."""
    m = re.fullmatch(r"\s*label_values\((.*)\)\s*", expr, re.S)
    if m is None:
        return expr
    inner = m.group(1)
    if "," not in inner:
        return None
    return inner.rsplit(",", 1)[0]


PROMQL_KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "and", "or", "unless", "offset", "atan2", "inf", "nan",
})
STRING_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
IDENTIFIER = re.compile(r"(?<![\w.:$])([A-Za-z_:][\w:]*)")


def metric_selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names its matchers use) for each metric selector in `expr`.

    Function and aggregation names, keywords, grouping labels, label
    matchers, ranges and string literals are not metric names.
    """
    expr = label_values_metric(expand_grafana_variables(expr)) or ""
    expr = STRING_LITERAL.sub('""', expr)
    # Label matchers {a="x", b=~"y"}: keep the label names per selector.
    matchers: list[set[str]] = []

    def take_matchers(m: re.Match[str]) -> str:
        matchers.append(set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", m.group(0))))
        return f" \x00{len(matchers) - 1}\x00 "

    expr = re.sub(r"\{[^}]*\}", take_matchers, expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # ranges and subqueries
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    selectors: list[tuple[str, set[str]]] = []
    for m in IDENTIFIER.finditer(expr):
        name = m.group(1)
        rest = expr[m.end():]
        if name in PROMQL_KEYWORDS or re.match(r"\s*\(", rest):
            continue  # a keyword, or a function / aggregation call
        labels: set[str] = set()
        if (block := re.match(r"\s*\x00(\d+)\x00", rest)) is not None:
            labels = matchers[int(block.group(1))]
        selectors.append((name, labels))
    return selectors


def grouping_labels(expr: str) -> set[str]:
    """Labels named in by (...) / without (...) / on (...) clauses."""
    expr = STRING_LITERAL.sub('""', expand_grafana_variables(expr))
    labels: set[str] = set()
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        labels.update(label.strip() for label in group.split(",") if label.strip())
    return labels


def all_expressions() -> list[tuple[str, str]]:
    return [(f"dashboard {where}", e) for where, e in dashboard_expressions()] + [
        (f"alerts {where}", e) for where, e in rule_expressions()]


# ------------------------------------------------------------------ promtool


def test_promtool_accepts_the_prometheus_config() -> None:
    out = run_promtool("check", "config", str(PROMETHEUS_CONFIG))
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_accepts_the_alert_rules() -> None:
    out = run_promtool("check", "rules", str(ALERT_RULES))
    assert out.returncode == 0, out.stdout + out.stderr


def test_alert_rules_pass_their_unit_tests() -> None:
    out = run_promtool("test", "rules", str(ALERT_TESTS))
    assert out.returncode == 0, out.stdout + out.stderr


def test_alert_unit_tests_cover_firing_and_silence() -> None:
    with open(ALERT_TESTS) as f:
        tests = yaml.safe_load(f)["tests"]
    cases = [case for test in tests for case in test.get("alert_rule_test", [])]
    fired = {case["alertname"] for case in cases if case.get("exp_alerts")}
    silent = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    assert {"FlagosdDown", "FlagosdOutOfMemoryRefusals"} <= fired, fired
    assert silent, "no test expects an alert to stay silent"


def test_every_alert_has_severity_summary_and_description() -> None:
    with open(ALERT_RULES) as f:
        rules = [rule for group in yaml.safe_load(f)["groups"] for rule in group["rules"]]
    names = {rule["alert"] for rule in rules}
    assert names == {"FlagosdDown", "FlagosdDeviceMemoryNearlyFull", "FlagosdOpErrorRate",
                     "FlagosdOutOfMemoryRefusals", "FlagosdRestarted",
                     "FlagosdHealthCheckFailing"}, names
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        for key in ("summary", "description"):
            assert "$labels" in rule["annotations"][key], (rule["alert"], key)


def test_prometheus_config_targets_flagosd_on_9400() -> None:
    with open(PROMETHEUS_CONFIG) as f:
        config = yaml.safe_load(f)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    targets = [t for sc in jobs["flagosd"]["static_configs"] for t in sc["targets"]]
    assert targets == [f"localhost:{METRICS_PORT}"], targets
    assert ALERT_RULES.name in config["rule_files"]


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    # promtool parses every expression of a rules file: put each query of the
    # dashboard (its variables expanded) into one as a recording rule.
    rules = []
    for i, (where, expr) in enumerate(dashboard_expressions()):
        metric = label_values_metric(expand_grafana_variables(expr))
        if metric is None:
            continue
        rules.append({"record": f"dashboard:query_{i}", "expr": metric,
                      "labels": {"where": where}})
    assert len(rules) > 20, f"only {len(rules)} queries in the dashboard"
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = run_promtool("check", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr


# ------------------------------------------------------------------ Grafana


def test_dashboard_shape() -> None:
    board = dashboard()
    assert 36 <= board["schemaVersion"] <= 41
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("instance", "device"):
        query = variables[name]["query"]
        query = query["query"] if isinstance(query, dict) else query
        assert query.startswith("label_values("), (name, query)
    panels = [p for p in iter_panels(board["panels"]) if p["type"] != "row"]
    ids = [p["id"] for p in iter_panels(board["panels"])]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
    # What an operator looks for first.
    exprs = " ".join(e for _, e in dashboard_expressions())
    assert "histogram_quantile(0.99" in exprs and "flagosd_op_duration_seconds_bucket" in exprs
    assert "rate(flagosd_device_busy_seconds_total" in exprs


def test_dashboard_and_rules_name_only_flagosd_metrics() -> None:
    for where, expr in all_expressions():
        selectors = metric_selectors(expr)
        assert selectors or "label_values(" in expr, f"{where}: no metric found in {expr!r}"
        for name, _ in selectors:
            assert name == "up" or name.startswith("flagosd_"), (
                f"{where}: {name!r} is not a flagosd metric (in {expr!r})")


def test_metric_name_extraction() -> None:
    expr = ('histogram_quantile(0.99, sum by (instance, le) (rate('
            'flagosd_op_duration_seconds_bucket{instance=~"$instance", device=~"$device"}'
            '[$__rate_interval]))) / on (instance) group_left () '
            '(time() - flagosd_start_time_seconds > bool 0) and up{job="flagosd"}')
    assert metric_selectors(expr) == [
        ("flagosd_op_duration_seconds_bucket", {"instance", "device"}),
        ("flagosd_start_time_seconds", set()),
        ("up", {"job"}),
    ]
    assert metric_selectors('label_values(flagosd_build_info{instance=~"$instance"}, version)') \
        == [("flagosd_build_info", {"instance"})]
    assert grouping_labels(expr) == {"instance", "le"}


# ------------------------------------------------------------------ Kubernetes


def kubernetes_documents() -> list[tuple[Path, dict[str, Any]]]:
    paths = sorted(KUBERNETES.glob("*.yaml"))
    assert {DAEMONSET, SERVICE, SERVICE_MONITOR, WORKLOAD} <= set(paths), paths
    return [(path, doc) for path in paths for doc in load_yaml_documents(path)]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS, ids=lambda v: v or "latest")
def test_manifests_match_the_kubernetes_schemas(version: str | None) -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (scripts/bootstrap)")
    version = version or kubernetes_validate.latest_version()
    checked = 0
    for path, doc in kubernetes_documents():
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: its fields are checked below
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = ".".join(str(p) for p in e.absolute_path)
            pytest.fail(f"{path.name}: {doc['kind']} {doc['metadata']['name']}: {where}: "
                        f"{e.message} (Kubernetes {version})")
        checked += 1
    assert checked >= 5


def daemonset() -> dict[str, Any]:
    return the_object(DAEMONSET, "DaemonSet")


def flagosd_container(ds: dict[str, Any]) -> dict[str, Any]:
    containers = ds["spec"]["template"]["spec"]["containers"]
    found = [c for c in containers if c["name"] == "flagosd"]
    assert len(found) == 1, [c["name"] for c in containers]
    return found[0]


def host_path_mounts(pod_spec: dict[str, Any], container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """hostPath -> (mountPath, type) for the container's hostPath volumes."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    mounts: dict[str, tuple[str, str]] = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]  # a mount must name a volume
        if "hostPath" in volume:
            mounts[volume["hostPath"]["path"]] = (mount["mountPath"],
                                                  volume["hostPath"].get("type", ""))
    return mounts


def test_daemonset_selector_matches_its_pods() -> None:
    ds = daemonset()
    assert ds["metadata"]["namespace"] == "flagos"
    selector = ds["spec"]["selector"]["matchLabels"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert selector and selector.items() <= labels.items(), (selector, labels)
    update = ds["spec"]["updateStrategy"]
    assert update["type"] == "RollingUpdate"
    assert update["rollingUpdate"]["maxUnavailable"] == 1
    assert ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 0


def test_daemonset_runs_flagosd_on_the_node_socket_with_metrics() -> None:
    ds = daemonset()
    container = flagosd_container(ds)
    command = container.get("command", []) + container.get("args", [])
    # The binary the package installs (deploy/container/Containerfile).
    assert command[0] == "/usr/bin/flagosd"
    assert f"--listen={SOCKET_ENDPOINT}" in command
    assert f"--metrics-listen=0.0.0.0:{METRICS_PORT}" in command
    ports = {p["name"]: p for p in container["ports"]}
    assert ports["metrics"]["containerPort"] == METRICS_PORT
    mounts = host_path_mounts(ds["spec"]["template"]["spec"], container)
    assert mounts[SOCKET_DIR] == (SOCKET_DIR, "DirectoryOrCreate"), mounts
    assert mounts["/dev/xpuctrl"] == ("/dev/xpuctrl", "CharDevice"), mounts
    assert mounts["/dev/xpu0"] == ("/dev/xpu0", "CharDevice"), mounts
    # Vendor variables come from the ConfigMap the same file defines.
    config_map = the_object(DAEMONSET, "ConfigMap")
    refs = [e["configMapRef"]["name"] for e in container.get("envFrom", []) if "configMapRef" in e]
    assert config_map["metadata"]["name"] in refs
    assert "XPU_ROOT" in config_map["data"]
    assert container["resources"]["requests"]


def test_daemonset_probes_ask_flagos_smi_for_health() -> None:
    container = flagosd_container(daemonset())
    for probe in ("livenessProbe", "readinessProbe"):
        command = container[probe]["exec"]["command"]
        assert "flagos-smi" in Path(command[0]).name, (probe, command)
        assert "--health" in command, (probe, command)
        assert f"--endpoint={SOCKET_ENDPOINT}" in command, (probe, command)


def test_service_selects_the_daemonset_pods_and_names_the_metrics_port() -> None:
    service = the_object(SERVICE, "Service")
    ds = daemonset()
    assert service["metadata"]["namespace"] == ds["metadata"]["namespace"]
    assert service["spec"]["clusterIP"] == "None"
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    selector = service["spec"]["selector"]
    assert selector and selector.items() <= pod_labels.items(), (selector, pod_labels)
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    container_ports = {p["name"]: p["containerPort"] for p in flagosd_container(ds)["ports"]}
    target = ports["metrics"]["targetPort"]
    assert target in container_ports or target in container_ports.values(), (target, container_ports)


def test_servicemonitor_targets_the_service_metrics_port() -> None:
    monitor = the_object(SERVICE_MONITOR, "ServiceMonitor")
    service = the_object(SERVICE, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    namespaces = monitor["spec"].get("namespaceSelector", {}).get("matchNames",
                                                                  [monitor["metadata"]["namespace"]])
    assert service["metadata"]["namespace"] in namespaces
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector and selector.items() <= service["metadata"]["labels"].items()
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    endpoints = monitor["spec"]["endpoints"]
    assert endpoints and all(e["port"] in service_ports for e in endpoints), (endpoints, service_ports)
    assert all(e.get("path", "/metrics") == "/metrics" for e in endpoints)


def test_workload_mounts_the_node_socket_and_names_it() -> None:
    pod = the_object(WORKLOAD, "Pod")
    spec = pod["spec"]
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env["FLAGOS_ENDPOINT"] == SOCKET_ENDPOINT
    mounts = host_path_mounts(spec, container)
    assert mounts[SOCKET_DIR][0] == SOCKET_DIR, mounts
    # The daemon's socket directory, as the DaemonSet mounts it.
    ds = daemonset()
    assert SOCKET_DIR in host_path_mounts(ds["spec"]["template"]["spec"], flagosd_container(ds))
    assert "import torch, torch_fl" in " ".join(container["command"])
    assert '"flagos"' in " ".join(container["command"])
    # An ordinary user in the socket's group (the daemon's runAsGroup).
    security = spec["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    flagos_gid = ds["spec"]["template"]["spec"]["securityContext"]["runAsGroup"]
    assert flagos_gid in security["supplementalGroups"], (flagos_gid, security)


def test_training_job_runs_torchrun_against_the_node_socket(start_daemon, tmp_path) -> None:
    job = the_object(TRAINING_JOB, "Job")
    spec = job["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env["FLAGOS_ENDPOINT"] == SOCKET_ENDPOINT
    assert host_path_mounts(spec, container)[SOCKET_DIR][0] == SOCKET_DIR
    ds = daemonset()
    flagos_gid = ds["spec"]["template"]["spec"]["securityContext"]["runAsGroup"]
    assert flagos_gid in spec["securityContext"]["supplementalGroups"]
    command = container["command"]
    assert command[:3] == ["python", "-m", "torch.distributed.run"], command
    # The script the Job mounts from its ConfigMap, run as the Job runs it
    # (torchrun, 2 ranks) against a daemon standing in for the node's.
    config_map = the_object(TRAINING_JOB, "ConfigMap")
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    script = Path(command[-1])
    assert volumes[mounts[str(script.parent)]]["configMap"]["name"] == config_map["metadata"]["name"]
    local = tmp_path / script.name
    local.write_text(config_map["data"][script.name])
    daemon = start_daemon()
    done = subprocess.run([sys.executable, *command[1:-1], str(local)],
                          env={**os.environ, "FLAGOS_ENDPOINT": daemon.endpoint,
                               "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    losses = [float(m) for m in re.findall(r"step +\d+ loss (\S+)", done.stdout)]
    assert len(losses) == 5 and losses[-1] < losses[0], done.stdout


# ------------------------------------------------------------------ a real scrape

HOLDER = r"""
import sys, torch, torch_fl
x = torch.ones(4, device="flagos")
torch.flagos.synchronize()
print("ready", flush=True)
sys.stdin.readline()  # until the second client has been refused

print((x + 1).cpu())                              # host to device, device to host
y = x.to("flagos:1")                               # device to device
print((y * 2).cpu())
a = torch.randn(64, 64, device="flagos")
print((a @ a).sum().item())
try:                                               # a shape error (the client's)
    torch.ones(2, 3, device="flagos") @ torch.ones(2, 3, device="flagos")
except RuntimeError as e:
    print("matmul:", e)
try:                                               # a command the daemon refuses
    torch_fl._C._test_bad_command("unknown_op_id")
except RuntimeError as e:
    print("bad command:", e)
try:                                               # an allocation beyond the device
    torch.empty(256 << 20, dtype=torch.uint8, device="flagos")
except torch.OutOfMemoryError as e:
    print("out of memory:", e)
try:                                               # an op that fails in the daemon
    x[torch.tensor([10], device="flagos")]
    torch.flagos.synchronize()
except RuntimeError as e:
    print("index:", e)
print((x * 3).sum().item())
torch.flagos.synchronize()
print("done", flush=True)
sys.stdin.readline()  # hold the session until scraped
"""

REFUSED = r"""
import torch, torch_fl
try:
    torch.ones(1, device="flagos")
except RuntimeError as e:
    print("refused:", e)
else:
    print("not refused")
"""


def scrape(url: str) -> dict[str, set[str]]:
    """metric name -> the label names of its samples, from a scrape of `url`.

    Names are the families' and their samples' (for a histogram also the
    _bucket/_sum/_count series, for a counter the _total one).
    """
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        family_labels = names.setdefault(family.name, set())
        if family.type == "counter":
            names.setdefault(family.name + "_total", set())
        for sample in family.samples:
            labels = set(sample.labels) - {"le", "quantile"}
            names.setdefault(sample.name, set()).update(labels)
            family_labels.update(labels)
            if family.type == "counter":
                names[family.name + "_total"].update(labels)
    return names


@pytest.fixture
def scraped(start_daemon, run_python, spawn_python, read_line) -> dict[str, set[str]]:
    """A scrape of a fresh daemon after a little of everything: ops, copies in all
    directions, a failing op, a refused command, an out-of-memory refusal and a
    refused session (--max-sessions=1).

    The work matters: a family whose children are added on first use (the
    `code`-labelled error counters) is not exposed until something counted.
    """
    d = start_daemon(device_memory="64MiB",
                     extra_args=["--metrics-listen=127.0.0.1:0", "--max-sessions=1"])
    url = d.metrics_url()
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", url), url
    holder = spawn_python(HOLDER, env={"FLAGOS_ENDPOINT": d.endpoint})
    lines: list[str] = []

    def next_line() -> str:
        try:
            line = read_line(holder, timeout=120)
        except pytest.fail.Exception:
            pytest.fail("the workload printed nothing for 120 s; its output so far:\n"
                        + "".join(lines) + "\nflagosd's log:\n" + d.log()[-4000:])
        lines.append(line)
        return line

    first = next_line()
    assert first.strip() == "ready", first + (holder.stderr.read() if holder.poll() is not None else "")
    refused = run_python(REFUSED, env={"FLAGOS_ENDPOINT": d.endpoint}, timeout=60)
    assert refused.returncode == 0, refused.stderr
    assert "refused:" in refused.stdout and "RESOURCE_EXHAUSTED" in refused.stdout, refused.stdout
    assert holder.stdin is not None
    holder.stdin.write("\n")
    holder.stdin.flush()
    while (line := next_line()) and line.strip() != "done":
        pass
    assert line.strip() == "done", "".join(lines) + holder.stderr.read()
    names = scrape(url)
    holder.stdin.write("\n")
    holder.stdin.flush()
    holder.wait(timeout=60)
    return names


def test_scrape_has_every_metric_the_dashboard_and_rules_use(scraped: dict[str, set[str]]) -> None:
    missing = []
    wrong_labels = []
    for where, expr in all_expressions():
        selectors = metric_selectors(expr)
        used_labels: set[str] = set()
        for name, matcher_labels in selectors:
            if name == "up" or (name in VENDOR_TELEMETRY_METRICS and name not in scraped):
                continue
            base = name
            if name not in scraped and name.endswith(HISTOGRAM_SUFFIXES):
                base = name.rsplit("_", 1)[0]
            if name not in scraped and base not in scraped:
                missing.append(f"{where}: {name}")
                continue
            labels = scraped.get(name, set()) | scraped.get(base, set())
            used_labels |= labels
            for label in matcher_labels - TARGET_LABELS - labels:
                wrong_labels.append(f"{where}: {name} has no label {label!r} (has {sorted(labels)})")
        # by (...) labels must be some selected metric's (or a target label).
        if all(name in scraped or name not in VENDOR_TELEMETRY_METRICS for name, _ in selectors):
            for label in grouping_labels(expr) - TARGET_LABELS - used_labels - {"le"}:
                wrong_labels.append(f"{where}: groups by {label!r}, which no metric in it has")
    assert not missing, "not in a scrape of flagosd:\n" + "\n".join(missing)
    assert not wrong_labels, "\n".join(wrong_labels)

    # And every metric docs/operations.md lists (all but the vendor
    # telemetry), with at least its labels.
    expected = {
        "flagosd_build_info": {"version", "backend", "torch_version"},
        "flagosd_start_time_seconds": set(),
        "flagosd_cpu_seconds_total": {"mode"},
        "flagosd_device_memory_total_bytes": {"device"},
        "flagosd_device_memory_used_bytes": {"device"},
        "flagosd_device_memory_reserved_bytes": {"device"},
        "flagosd_device_busy_seconds_total": {"device"},
        "flagosd_ops_total": {"device", "route"},
        "flagosd_op_errors_total": {"device"},
        "flagosd_op_duration_seconds_bucket": {"device"},
        "flagosd_op_duration_seconds_sum": {"device"},
        "flagosd_op_duration_seconds_count": {"device"},
        "flagosd_copy_bytes_total": {"device", "direction"},
        "flagosd_segment_allocations_total": {"device"},
        "flagosd_segment_allocated_bytes_total": {"device"},
        "flagosd_out_of_memory_total": {"device"},
        "flagosd_staging_bytes": set(),
        "flagosd_pinned_bytes": set(),
        "flagosd_sessions": set(),
        "flagosd_sessions_opened_total": set(),
        "flagosd_sessions_refused_total": set(),
        "flagosd_rpc_errors_total": {"code"},
        "flagosd_command_errors_total": {"code"},
        "flagosd_health_check_failures_total": set(),
    }
    problems = [f"{name}: missing" if name not in scraped else
                f"{name}: labels {sorted(scraped[name])}, expected at least {sorted(labels)}"
                for name, labels in expected.items()
                if name not in scraped or not labels <= scraped[name]]
    assert not problems, "\n".join(problems)
    if run_backend() == "kunlunxin":
        # The test runs kunlunxin over the fake libxpurt, whose libxpuml
        # reports telemetry.
        absent = sorted(VENDOR_TELEMETRY_METRICS - scraped.keys())
        assert not absent, f"the kunlunxin backend exported no {absent}"


# ---------------------------------------------------------------- image and unit recipes

CONTAINERFILE = DEPLOY / "container" / "Containerfile"


def project_version() -> str:
    match = re.search(r"project\(flagos VERSION (\S+)", (REPO / "CMakeLists.txt").read_text())
    assert match
    return match.group(1)


def test_the_image_recipe_installs_the_package_the_daemonset_runs() -> None:
    text = CONTAINERFILE.read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert lines[0].startswith("FROM debian:"), lines[0]
    version = project_version()
    assert f"ARG FLAGOSD_VERSION={version}" in lines
    # The file scripts/package writes, installed through apt (its Depends).
    assert "COPY flagosd_${FLAGOSD_VERSION}_amd64.deb /tmp/" in lines
    assert "apt-get install -y --no-install-recommends /tmp/flagosd_${FLAGOSD_VERSION}_amd64.deb" in text
    ds = daemonset()
    container = flagosd_container(ds)
    # The image the DaemonSet names is this version's; its command is the
    # packaged binary, which the image's entry point also is.
    assert container["image"].endswith(f"/flagosd:{version}"), container["image"]
    assert container["command"][0] == "/usr/bin/flagosd"
    assert 'ENTRYPOINT ["/usr/bin/flagosd"]' in lines
    # The image's `flagos` group (the socket's, --socket-group) has the gid
    # the pods share the socket by.
    gid = ds["spec"]["template"]["spec"]["securityContext"]["runAsGroup"]
    assert f"RUN groupadd --system --gid {gid} flagos" in lines
    workload = the_object(WORKLOAD, "Pod")
    assert gid in workload["spec"]["securityContext"]["supplementalGroups"]
    # What deploy/CMakeLists.txt installs where the image expects it.
    install = (DEPLOY / "CMakeLists.txt").read_text()
    assert "RUNTIME DESTINATION bin" in install
    assert "needs no vendor SDK" not in DAEMONSET.read_text()


def p800_recipe(doc: Path) -> str:
    """The shell block after the `<!-- p800-recipe` marker in `doc`."""
    text = doc.read_text()
    marker = text.index("<!-- p800-recipe")
    block = re.search(r"```sh\n(.*?)```", text[marker:], re.S)
    assert block, doc
    return block.group(1)


def test_the_p800_recipe_is_one_and_the_same_in_both_guides() -> None:
    guides = [REPO / "docs/operations.md", REPO / "docs/vendors/kunlunxin/installation.md"]
    recipes = [p800_recipe(doc) for doc in guides]
    assert recipes[0] == recipes[1], recipes
    recipe = recipes[0]
    # The drop-in the package ships, put where systemd reads drop-ins, and
    # the unit's own EnvironmentFile.
    assert ("/usr/share/flagosd/kunlunxin.conf \\\n"
            "  /etc/systemd/system/flagosd.service.d/kunlunxin.conf") in recipe
    assert "install(FILES systemd/flagosd.service.d/kunlunxin.conf DESTINATION share/flagosd)" in \
        (DEPLOY / "CMakeLists.txt").read_text()
    assert "sudoedit /etc/default/flagosd" in recipe
    assert "EnvironmentFile=-/etc/default/flagosd" in (DEPLOY / "systemd/flagosd.service").read_text()
    # The contradicting recipe is gone: no second environment file, no
    # ExecStart= override that would drop $FLAGOSD_ARGS and the drop-in.
    for doc in guides:
        text = doc.read_text()
        assert "kunlunxin.env" not in text, doc
        assert "ExecStart=\n" not in text, doc
