"""The Helm chart in charts/sluice: lint, render, Kubernetes schema validation,
the properties a sidecar deployment must keep, and `sluice check` on the
configuration the chart renders.

Run through scripts/test-chart.sh, which installs the tools and builds the
binary. SLUICE_BIN names the sluice binary (default: target/debug/sluice).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "sluice"
ALL_OPTIONS = CHART / "ci" / "all-options-values.yaml"
DASHBOARD = CHART / "dashboards" / "sluice.json"

# The oldest Kubernetes with native sidecars on by default, and the newest
# kubernetes-validate knows.
KUBE_VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]

# Custom resources have no schema in kubernetes-validate; they are checked
# structurally below instead (test_service_monitor_scrapes_admin_port).
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}

# Every metric sluice exports (the dashboard may use no other).
SLUICE_METRICS = {
    "sluice_requests_total",
    "sluice_decision_duration_seconds",
    "sluice_store_errors_total",
    "sluice_store_breaker_open",
    "sluice_store_script_loads_total",
    "sluice_store_dedupe_hits_total",
    "sluice_forwarded_without_decision_total",
    "sluice_upstream_responses_total",
    "sluice_upstream_duration_seconds",
    "sluice_config_reloads_total",
    "sluice_config_revision",
    "sluice_build_info",
}

# Values for the ${NAME} references in a rendered configuration, as the
# Secrets would provide them.
DUMMY_ENV = {
    "SLUICE_PSEUDONYM_KEY": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    "REDIS_URL": "redis://127.0.0.1:6379/0",
    "REDIS_PASSWORD": "not-a-real-password",
}

CASES = {
    "default": {},
    "native-sidecar": {"sluice": {"nativeSidecar": True}},
    "all-options": yaml.safe_load(ALL_OPTIONS.read_text()),
}


@dataclass
class Render:
    """One `helm template` of the chart, parsed."""

    values: dict[str, Any]  # the values the chart saw (defaults merged in)
    docs: list[dict[str, Any]]
    notes: str
    fullname: str = field(init=False)

    def __post_init__(self) -> None:
        self.fullname = self.one("Deployment")["metadata"]["name"]

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [d for d in self.all(kind) if name is None or d["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
        return found[0]

    @property
    def pod(self) -> dict[str, Any]:
        return self.one("Deployment")["spec"]["template"]

    @property
    def sluice(self) -> dict[str, Any]:
        spec = self.pod["spec"]
        found = [c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == "sluice"]
        assert len(found) == 1, f"expected one sluice container, found {len(found)}"
        return found[0]

    @property
    def app(self) -> dict[str, Any]:
        name = self.values["app"]["name"]
        found = [c for c in self.pod["spec"]["containers"] if c["name"] == name]
        assert len(found) == 1
        return found[0]

    @property
    def config_text(self) -> str:
        return self.one("ConfigMap", f"{self.fullname}-config")["data"]["sluice.yaml"]

    @property
    def config(self) -> dict[str, Any]:
        return yaml.safe_load(self.config_text)


def render(values: dict[str, Any]) -> Render:
    with helm.Chart.load(CHART) as chart:
        merged = chart.merge_values(values)
        manifests = chart.render(values, name="rel", namespace="shop")
    docs = []
    notes = ""
    for path, text in manifests.items():
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return Render(values=merged, docs=docs, notes=notes)


@pytest.fixture(scope="module", params=list(CASES))
def case(request: pytest.FixtureRequest) -> tuple[str, Render]:
    return request.param, render(CASES[request.param])


def container_port(container: dict[str, Any], port: int | str) -> int:
    """The number a probe or targetPort refers to in `container`."""
    if isinstance(port, int):
        assert any(p["containerPort"] == port for p in container["ports"]), port
        return port
    named = [p["containerPort"] for p in container["ports"] if p.get("name") == port]
    assert len(named) == 1, f"port {port!r} not declared by {container['name']}"
    return named[0]


def sluice_bin() -> Path:
    if os.environ.get("SLUICE_BIN"):
        return Path(os.environ["SLUICE_BIN"])
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target / "debug" / "sluice"


def sluice_check(config_text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    binary = sluice_bin()
    assert binary.is_file(), f"sluice binary not found at {binary} (build it or set SLUICE_BIN)"
    path = tmp_path / "sluice.yaml"
    path.write_text(config_text)
    env = {k: v for k, v in os.environ.items() if k not in DUMMY_ENV}
    for name in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", config_text):
        env[name] = DUMMY_ENV.get(name, "dummy")
    return subprocess.run(
        [str(binary), "check", "--config", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# --- lint and schema validation -------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_lint_is_clean(name: str) -> None:
    report = helm.lint(CHART, CASES[name], strict=True, kube_version="v1.29.0")
    assert report["errors"] == []
    # Severity 2 is a warning, 3 an error; the only info is "icon is recommended".
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_every_manifest_validates_against_kubernetes_schemas(case: tuple[str, Render]) -> None:
    _, r = case
    validated = set()
    problems = []
    for doc in r.docs:
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                problems.append(
                    f"{doc['kind']}/{doc['metadata']['name']} against {version}: {path}: {e.message}"
                )
        validated.add(doc["kind"])
    assert problems == []
    assert {"Deployment", "Service", "ConfigMap"} <= validated


def test_values_schema_rejects_mistakes() -> None:
    bad_values = [
        {"unknown": 1},
        {"sluice": {"ports": {"traffic": "8080"}}},
        {"sluice": {"ports": {"traffic": 70000}}},
        {"sluice": {"logFormat": "xml"}},
        {"sluice": {"livenessProbe": {"httpGet": {"path": "/", "port": 1}}}},
        {"sluice": {"config": {"store": {"kind": "memcached"}}}},
        {"app": {"name": "sluice"}},
        {"service": {"type": "ExternalName"}},
    ]
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema({})
        for values in bad_values:
            with pytest.raises(helm.HelmValuesError):
                chart.validate_schema(values)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"app": {"port": 8080}}, "app.port"),
        ({"app": {"port": 9901}}, "app.port"),
        ({"sluice": {"ports": {"traffic": 9000, "admin": 9000}}}, "must differ"),
        ({"sluice": {"config": {"server": {"listen": "0.0.0.0:1"}}}}, "listen"),
        ({"sluice": {"config": {"upstream": {"url": "http://x"}}}}, "upstream.url"),
        ({"sluice": {"config": {"version": 2}}}, "version"),
        (
            {"podDisruptionBudget": {"enabled": True, "minAvailable": 1, "maxUnavailable": 1}},
            "not both",
        ),
    ],
)
def test_render_refuses_inconsistent_values(values: dict[str, Any], message: str) -> None:
    refused = (helm.HelmRenderError, helm.HelmValuesError)
    with helm.Chart.load(CHART) as chart, pytest.raises(refused) as err:
        chart.render(values, name="rel")
    assert message in str(err.value)


# --- the sidecar's shape ----------------------------------------------------


def test_service_targets_sluice_never_the_app(case: tuple[str, Render]) -> None:
    _, r = case
    traffic = r.values["sluice"]["ports"]["traffic"]
    app_port = r.values["app"]["port"]
    service = r.one("Service", r.fullname)
    assert [p["targetPort"] for p in service["spec"]["ports"]] == [traffic]
    assert service["spec"]["selector"] == r.one("Deployment")["spec"]["selector"]["matchLabels"]
    for svc in r.all("Service"):
        for p in svc["spec"]["ports"]:
            target = container_port(r.sluice, p["targetPort"])
            assert target != app_port, f"Service {svc['metadata']['name']} reaches the app directly"


def test_probes_hit_health_endpoints_on_admin_port(case: tuple[str, Render]) -> None:
    _, r = case
    admin = r.values["sluice"]["ports"]["admin"]
    expected = {"livenessProbe": "/healthz", "readinessProbe": "/readyz", "startupProbe": "/healthz"}
    for probe, path in expected.items():
        get = r.sluice[probe]["httpGet"]
        assert get["path"] == path, probe
        assert container_port(r.sluice, get["port"]) == admin, probe
    assert r.config["server"]["admin"].rsplit(":", 1)[1] == str(admin)


def test_sluice_runs_restricted(case: tuple[str, Render]) -> None:
    _, r = case
    sc = r.sluice["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert r.pod["spec"]["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert r.pod["spec"]["automountServiceAccountToken"] is False


def test_default_pod_meets_restricted_pod_security_standard() -> None:
    r = render({})
    spec = r.pod["spec"]
    pod_sc = spec.get("securityContext", {})
    for c in spec.get("initContainers", []) + spec["containers"]:
        sc = c.get("securityContext", {})
        assert sc.get("allowPrivilegeEscalation") is False, c["name"]
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], c["name"]
        assert sc.get("privileged", False) is False, c["name"]
        assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, c["name"]
        assert sc.get("runAsUser", pod_sc.get("runAsUser", 1)) != 0, c["name"]
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {}))
        assert seccomp.get("type") in {"RuntimeDefault", "Localhost"}, c["name"]


def test_sidecar_mode(case: tuple[str, Render]) -> None:
    _, r = case
    spec = r.pod["spec"]
    in_containers = [c for c in spec["containers"] if c["name"] == "sluice"]
    in_init = [c for c in spec.get("initContainers", []) if c["name"] == "sluice"]
    if r.values["sluice"]["nativeSidecar"]:
        assert in_containers == []
        assert len(in_init) == 1
        assert in_init[0]["restartPolicy"] == "Always"
    else:
        assert in_init == []
        assert len(in_containers) == 1
        assert "restartPolicy" not in in_containers[0]
    assert r.pod["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] == r.app["name"]


def test_config_is_mounted_as_a_directory_and_reloaded_not_rolled(case: tuple[str, Render]) -> None:
    _, r = case
    volumes = {v["name"]: v for v in r.pod["spec"]["volumes"]}
    mounts = [m for m in r.sluice["volumeMounts"] if m["mountPath"] == "/etc/sluice"]
    assert len(mounts) == 1
    mount = mounts[0]
    # A subPath mount never sees ConfigMap updates, so reload would not work.
    assert "subPath" not in mount and "subPathExpr" not in mount
    assert mount["readOnly"] is True
    config_map = volumes[mount["name"]]["configMap"]["name"]
    assert "sluice.yaml" in r.one("ConfigMap", config_map)["data"]
    args = r.sluice["args"]
    assert args[:3] == ["run", "--config", "/etc/sluice/sluice.yaml"]
    # A checksum annotation would restart pods on every policy change that
    # sluice applies by itself.
    annotations = r.pod["metadata"].get("annotations", {})
    assert not [k for k in annotations if k.startswith("checksum/")]


def test_chart_fills_addresses_and_upstream(case: tuple[str, Render]) -> None:
    _, r = case
    cfg = r.config
    ports = r.values["sluice"]["ports"]
    assert cfg["version"] == 1
    assert cfg["server"]["listen"] == f"0.0.0.0:{ports['traffic']}"
    assert cfg["server"]["admin"] == f"0.0.0.0:{ports['admin']}"
    assert cfg["upstream"]["url"] == f"http://127.0.0.1:{r.values['app']['port']}"
    declared = {p["name"]: p["containerPort"] for p in r.sluice["ports"]}
    assert declared == {"http": ports["traffic"], "admin": ports["admin"]}
    # The user's configuration passes through.
    user = r.values["sluice"]["config"]
    assert cfg["policies"] == user["policies"]
    assert cfg["routes"] == user["routes"]


def test_readme_example_renders_and_validates() -> None:
    readme = (CHART / "README.md").read_text()
    [example] = re.findall(r"```yaml\n(.*?)```", readme, re.DOTALL)
    r = render(yaml.safe_load(example))
    for doc in r.docs:
        kubernetes_validate.validate(doc, KUBE_VERSIONS[-1], strict=True)
    assert r.config["store"]["url"] == "${REDIS_URL}"
    assert r.config["identity"]["pseudonym_key"] == "${SLUICE_PSEUDONYM_KEY}"


def test_ipv6_bind_address_is_bracketed() -> None:
    r = render({"sluice": {"bindAddress": "::"}})
    assert r.config["server"]["listen"] == "[::]:8080"
    assert r.config["server"]["admin"] == "[::]:9901"


def test_secrets_reach_sluice_only_as_env_references(case: tuple[str, Render]) -> None:
    _, r = case
    env = {e["name"]: e for e in r.sluice["env"]}
    for name in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", r.config_text):
        assert name in env, f"${{{name}}} used in sluice.yaml but not set on the container"
    secrets = r.values["sluice"]["secrets"]
    for var, ref in [("SLUICE_PSEUDONYM_KEY", secrets["pseudonymKey"]), ("REDIS_URL", secrets["redisUrl"])]:
        if ref["secretName"]:
            assert env[var]["valueFrom"]["secretKeyRef"] == {"name": ref["secretName"], "key": ref["key"]}
        else:
            assert var not in env


def test_all_options_wires_secrets_into_config() -> None:
    r = render(CASES["all-options"])
    assert r.config["identity"]["pseudonym_key"] == "${SLUICE_PSEUDONYM_KEY}"
    assert r.config["store"] == {
        **CASES["all-options"]["sluice"]["config"]["store"],
        "url": "${REDIS_URL}",
        # on_failure: local, and no share given: one per replica.
        "local_share": CASES["all-options"]["replicaCount"],
    }
    env = {e["name"]: e for e in r.sluice["env"]}
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "redis-acl", "key": "password"}
    assert r.sluice["args"][3:] == ["--log-format", "text"]
    assert r.sluice["lifecycle"]["preStop"]["sleep"]["seconds"] == 5


def redis_values(replicas: int, store: dict[str, Any], policies: dict[str, Any] | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {"store": {"kind": "redis", "url": "redis://redis:6379", **store}}
    if policies:
        config["policies"] = policies
    return {
        "replicaCount": replicas,
        "sluice": {"secrets": {"pseudonymKey": {"secretName": "keys", "key": "k"}}, "config": config},
    }


@pytest.mark.parametrize(
    ("values", "share"),
    [
        # The replicas share the store: each enforces a replicaCount-th.
        (redis_values(4, {"on_failure": "local"}), 4),
        # What the user writes wins.
        (redis_values(4, {"on_failure": "local", "local_share": 2}), 2),
        # One policy using `local` is enough.
        (
            redis_values(
                5,
                {"on_failure": "deny"},
                {"api": {"algorithm": "fixed-window", "limit": 9, "window": "1m", "on_failure": "local"}},
            ),
            5,
        ),
        # Nothing uses `local`: no share (sluice would refuse one).
        (redis_values(4, {"on_failure": "deny"}), None),
        ({"replicaCount": 4}, None),
    ],
)
def test_local_share_follows_replica_count(values: dict[str, Any], share: int | None, tmp_path: Path) -> None:
    r = render(values)
    assert r.config["store"].get("local_share") == share
    result = sluice_check(r.config_text, tmp_path)
    assert result.returncode == 0, f"sluice check failed:\n{result.stdout}\n{result.stderr}"


def test_prometheus_scrape_annotations(case: tuple[str, Render]) -> None:
    _, r = case
    annotations = r.pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(r.values["sluice"]["ports"]["admin"])
    assert annotations["prometheus.io/path"] == "/metrics"


def test_optional_resources_follow_their_switches() -> None:
    def kinds(r: Render) -> list[str]:
        return sorted(d["kind"] for d in r.docs)

    assert kinds(render({})) == ["ConfigMap", "Deployment", "Service"]
    assert kinds(render(CASES["all-options"])) == [
        "ConfigMap",
        "ConfigMap",
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Service",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ]


def test_service_monitor_scrapes_admin_port() -> None:
    r = render(CASES["all-options"])
    admin = r.values["sluice"]["ports"]["admin"]
    monitor = r.one("ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    selected = [s for s in r.all("Service") if selector.items() <= s["metadata"]["labels"].items()]
    assert [s["metadata"]["name"] for s in selected] == [f"{r.fullname}-metrics"]
    ports = {p["name"]: p for p in selected[0]["spec"]["ports"]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert container_port(r.sluice, ports[endpoint["port"]]["targetPort"]) == admin
    assert list(ports) == [endpoint["port"]]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_network_policy_admits_only_sluice_ports() -> None:
    r = render(CASES["all-options"])
    policy = r.one("NetworkPolicy")
    ports = sorted(p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"])
    sluice_ports = r.values["sluice"]["ports"]
    assert ports == sorted([sluice_ports["traffic"], sluice_ports["admin"]])
    assert r.values["app"]["port"] not in ports


def test_pdb_selects_the_pods() -> None:
    r = render(CASES["all-options"])
    pdb = r.one("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= r.pod["metadata"]["labels"].items()
    assert pdb["spec"]["maxUnavailable"] == "25%"


def test_notes_point_at_sluice() -> None:
    r = render({})
    assert f"svc/{r.fullname} 8080:80" in r.notes
    assert "/readyz" in r.notes
    assert "per replica" in r.notes  # the memory store warning
    assert "per replica" not in render(CASES["all-options"]).notes


# --- the dashboard ----------------------------------------------------------


def dashboard_exprs(dashboard: dict[str, Any]) -> dict[str, list[str]]:
    return {p["title"]: [t["expr"] for t in p["targets"]] for p in dashboard["panels"]}


def test_dashboard_queries_the_metrics_sluice_exports() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = dashboard_exprs(dashboard)
    joined = {title: " ".join(e) for title, e in exprs.items()}
    deny_ratio = (
        r'sum by \(route\) \(rate\(sluice_requests_total\{[^}]*outcome="denied"[^}]*\}\[5m\]\)\)'
        r" / sum by \(route\) \(rate\(sluice_requests_total\{[^}]*\}\[5m\]\)\)"
    )
    # What the panels must compute, as patterns on their queries.
    required = [
        r"sum by \(outcome\) \(rate\(sluice_requests_total\{[^}]*\}\[5m\]\)\)",
        deny_ratio,
        r"histogram_quantile\(0\.99, sum by \(le, store\) \(rate\(sluice_decision_duration_seconds_bucket",
        r"rate\(sluice_store_errors_total",
        r"sluice_store_breaker_open",
        r"sluice_config_reloads_total",
    ]
    for pattern in required:
        assert any(re.search(pattern, q) for q in joined.values()), pattern

    known = SLUICE_METRICS | {f"{m}_bucket" for m in SLUICE_METRICS}
    for title, queries in exprs.items():
        for q in queries:
            for metric in re.findall(r"\bsluice_[a-z_]+", q):
                assert metric in known, f"{title}: unknown metric {metric}"

    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in dashboard["panels"]:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for q in " ".join(joined.values()).split("$")[1:]:
        assert re.match(r"[a-z_]+", q).group(0) in variables


def test_dashboard_configmap_carries_the_shipped_file() -> None:
    r = render(CASES["all-options"])
    cm = r.one("ConfigMap", f"{r.fullname}-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["sluice.json"]) == json.loads(DASHBOARD.read_text())


def test_packaged_chart_ships_dashboard_not_ci_values() -> None:
    with helm.Chart.load(CHART) as chart:
        names = {f["name"] for f in chart.files}
    assert "dashboards/sluice.json" in names
    assert not [n for n in names if n.startswith("ci/")]


# --- the rendered configuration passes `sluice check` ----------------------


def test_sluice_check_accepts_rendered_config(case: tuple[str, Render], tmp_path: Path) -> None:
    _, r = case
    result = sluice_check(r.config_text, tmp_path)
    assert result.returncode == 0, f"sluice check failed:\n{result.stdout}\n{result.stderr}"
    # `check` prints the route table.
    for route in r.config["routes"]:
        assert route["name"] in result.stdout, route["name"]


def test_sluice_check_refuses_a_broken_render(tmp_path: Path) -> None:
    """The acceptance above means something only if check can refuse."""
    r = render(
        {"sluice": {"config": {"routes": [{"name": "r", "match": {"path": "/x"}, "policy": "absent"}]}}}
    )
    result = sluice_check(r.config_text, tmp_path)
    assert result.returncode != 0
    assert "absent" in result.stdout + result.stderr


# --- the image the chart runs ------------------------------------------------


def test_image_agrees_with_chart() -> None:
    """The chart relies on the image's entrypoint, user and ports."""
    stages = re.split(r"(?m)^FROM ", (ROOT / "Dockerfile").read_text())[1:]
    assert len(stages) == 2, "a builder stage and a runtime stage"
    runtime = {}
    for line in stages[-1].splitlines():
        word, _, rest = line.partition(" ")
        if word.isupper():
            runtime[word] = rest.strip()
    assert "nonroot" in stages[-1].splitlines()[0]
    assert runtime["USER"].split(":")[0] == "65532"
    assert json.loads(runtime["ENTRYPOINT"]) == ["sluice"]
    assert json.loads(runtime["CMD"]) == ["run", "--config", "/etc/sluice/sluice.yaml"]
    defaults = render({})
    ports = defaults.values["sluice"]["ports"]
    assert runtime["EXPOSE"].split() == [str(ports["traffic"]), str(ports["admin"])]
    assert defaults.sluice["securityContext"]["runAsUser"] == int(runtime["USER"].split(":")[0])
    assert defaults.sluice["args"][:3] == json.loads(runtime["CMD"])
    assert "cargo build --release --locked" in stages[0]
