"""The Helm chart in charts/sluice and the Kustomize component in
deploy/kustomize: lint, render, `kubectl kustomize`, Kubernetes schema
validation, the properties a sidecar deployment must keep, and `sluice check`
on every configuration rendered.

Run through scripts/test-chart.sh, which installs the tools and builds the
binary. SLUICE_BIN names the sluice binary (default: target/debug/sluice);
KUBECTL the kubectl binary (scripts/test-chart.sh installs a pinned one).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
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
HELPERS = CHART / "templates" / "_helpers.tpl"
OPERATIONS_DOC = ROOT / "docs" / "OPERATIONS.md"
KUBERNETES_DOC = ROOT / "docs" / "KUBERNETES.md"
README = ROOT / "README.md"
KUSTOMIZE = ROOT / "deploy" / "kustomize"
EXAMPLE = KUSTOMIZE / "example"
# The application as its team deploys it, without sluice.
LEGACY_DEPLOYMENT = EXAMPLE / "legacy" / "deployment.yaml"
LEGACY_SERVICE = EXAMPLE / "legacy" / "service.yaml"

# The oldest Kubernetes with native sidecars on by default, and the newest
# kubernetes-validate knows.
KUBE_VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]

# Custom resources have no schema in kubernetes-validate; they are checked
# structurally below instead (test_service_monitor_scrapes_admin_port).
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}

# Every metric sluice exports, read from its one table (src/telemetry/names.rs):
# the dashboard and the alert rules may use no other.
NAMES_RS = ROOT / "src" / "telemetry" / "names.rs"
SLUICE_METRICS = set(re.findall(r'pub const [A-Z_]+: &str = "(sluice_[a-z_]+)";', NAMES_RS.read_text()))
SLUICE_HISTOGRAMS = set(re.findall(r'Metric::seconds\(\s*([A-Z_]+),', NAMES_RS.read_text()))
# The series names a query may use: a histogram's `_bucket`, `_sum`, `_count`.
SLUICE_SERIES = SLUICE_METRICS | {
    f"{m}{suffix}" for m in SLUICE_METRICS if m.endswith("_seconds") for suffix in ("_bucket", "_sum", "_count")
}
RULES_FILE = ROOT / "deploy" / "prometheus" / "sluice-rules.yaml"
CHART_RULES = CHART / "rules" / "sluice-rules.yaml"

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

# sluice added to the legacy Deployment of the Kustomize example.
SIDECAR_ONLY = yaml.safe_load((CHART / "ci" / "sidecar-only-values.yaml").read_text())


@dataclass
class Render:
    """One `helm template` of the chart, parsed."""

    values: dict[str, Any]  # the values the chart saw (defaults merged in)
    docs: list[dict[str, Any]]
    notes: str
    fullname: str = field(init=False)

    def __post_init__(self) -> None:
        # The Service clients use (the metrics one is a component).
        [main] = [s for s in self.all("Service") if "app.kubernetes.io/component" not in s["metadata"]["labels"]]
        self.fullname = main["metadata"]["name"]

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


def check_manifests(docs: list[dict[str, Any]], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`sluice check-manifests` over `docs`, as one rendered file."""
    binary = sluice_bin()
    assert binary.is_file(), f"sluice binary not found at {binary} (build it or set SLUICE_BIN)"
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return subprocess.run(
        [str(binary), "check-manifests", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


# --- lint and schema validation -------------------------------------------


LINT_CASES = {**CASES, "sidecar-only": SIDECAR_ONLY}


@pytest.mark.parametrize("name", list(LINT_CASES))
def test_lint_is_clean(name: str) -> None:
    report = helm.lint(CHART, LINT_CASES[name], strict=True, kube_version="v1.29.0")
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
        {"mode": "sidecar"},
        {"sidecarOnly": {"selector": {"app": 1}}},
        {"sluice": {"secretsChecksum": 1}},
        {"sluice": {"config": {"server": {"shutdown_delay": "5 seconds"}}}},
        {"sluice": {"config": {"server": {"shutdown_grace": 20}}}},
        {"networkPolicy": {"enabled": "yes"}},
        {"app": {"stopSeconds": -1}},
        {"metrics": {"podMonitor": {"enabled": "true"}}},
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
        ({"mode": "sidecar-only"}, "needs sidecarOnly.selector"),
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


def assert_restricted(container: dict[str, Any], pod_sc: dict[str, Any]) -> None:
    """The restricted Pod Security Standard's container rules."""
    sc = container.get("securityContext", {})
    name = container["name"]
    assert sc.get("allowPrivilegeEscalation") is False, name
    assert sc.get("capabilities", {}).get("drop") == ["ALL"], name
    assert not sc.get("capabilities", {}).get("add"), name
    assert sc.get("privileged", False) is False, name
    assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, name
    assert sc.get("runAsUser", pod_sc.get("runAsUser", 1)) != 0, name
    seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {}))
    assert seccomp.get("type") in {"RuntimeDefault", "Localhost"}, name


def test_sluice_container_meets_restricted_pod_security_standard(case: tuple[str, Render]) -> None:
    """sluice's own container is restricted; the application's security
    context is its team's (see the next test)."""
    _, r = case
    assert_restricted(r.sluice, r.pod["spec"].get("securityContext", {}))


def test_app_security_context_is_the_teams() -> None:
    # Nothing by default: the application runs as its image says.
    assert "securityContext" not in render({}).app
    # What the values say, as written.
    written = CASES["all-options"]["app"]["securityContext"]
    assert render(CASES["all-options"]).app["securityContext"] == written
    # Even root, while sluice beside it stays restricted.
    root = render({"app": {"securityContext": {"runAsUser": 0, "runAsNonRoot": False}}})
    assert root.app["securityContext"] == {"runAsUser": 0, "runAsNonRoot": False}
    assert_restricted(root.sluice, root.pod["spec"].get("securityContext", {}))


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
    # A checksum of the whole configuration would restart pods on every
    # policy change that sluice applies by itself: the only checksum covers
    # what sluice reads at start (test_restart_checksum_* below).
    annotations = r.pod["metadata"].get("annotations", {})
    assert [k for k in annotations if k.startswith("checksum/")] == ["checksum/sluice-restart"]


def test_chart_fills_addresses_and_upstream(case: tuple[str, Render]) -> None:
    _, r = case
    cfg = r.config
    ports = r.values["sluice"]["ports"]
    assert cfg["version"] == 1
    assert cfg["server"]["listen"] == f"0.0.0.0:{ports['traffic']}"
    assert cfg["server"]["admin"] == f"0.0.0.0:{ports['admin']}"
    assert cfg["upstream"]["url"] == f"http://127.0.0.1:{r.values['app']['port']}"
    assert cfg["server"]["shutdown_delay"] == "5s"
    declared = {p["name"]: p["containerPort"] for p in r.sluice["ports"]}
    assert declared == {"sluice": ports["traffic"], "sluice-metrics": ports["admin"]}
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

    assert kinds(render({})) == ["ConfigMap", "Deployment", "NetworkPolicy", "Service"]
    assert kinds(render({"networkPolicy": {"enabled": False}})) == ["ConfigMap", "Deployment", "Service"]
    assert kinds(render(CASES["all-options"])) == [
        "ConfigMap",
        "ConfigMap",
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "PodMonitor",
        "PrometheusRule",
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

    for title, queries in exprs.items():
        for q in queries:
            for metric in re.findall(r"\bsluice_[a-z_]+", q):
                assert metric in SLUICE_SERIES, f"{title}: unknown metric {metric}"

    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in dashboard["panels"]:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for q in " ".join(joined.values()).split("$")[1:]:
        assert re.match(r"[a-z_]+", q).group(0) in variables


def test_every_dashboard_panel_queries_metrics_sluice_exports() -> None:
    """Every panel has a query, and every query names at least one series of
    the table and none that is not in it (a renamed metric breaks this)."""
    assert len(SLUICE_METRICS) > 40, "names.rs was not read"
    assert "sluice_redis_calls_total" in SLUICE_METRICS
    dashboard = json.loads(DASHBOARD.read_text())
    for title, queries in dashboard_exprs(dashboard).items():
        assert queries, f"{title}: no query"
        for q in queries:
            named = re.findall(r"\bsluice_[a-z_]+", q)
            assert named, f"{title}: {q} names no sluice metric"
            unknown = [m for m in named if m not in SLUICE_SERIES]
            assert unknown == [], f"{title}: {unknown} not exported by sluice"


def test_every_dashboard_query_parses_as_promql(tmp_path: Path) -> None:
    """Each query, its variables filled in, as a recording rule that
    `promtool check rules` parses."""
    queries = [q for qs in dashboard_exprs(json.loads(DASHBOARD.read_text())).values() for q in qs]
    rules = [
        {"record": f"dashboard:query_{i}", "expr": re.sub(r"\$[a-z_]+", ".*", q)} for i, q in enumerate(queries)
    ]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_has_a_panel_for_each_operator_question() -> None:
    joined = " ".join(" ".join(e) for e in dashboard_exprs(json.loads(DASHBOARD.read_text())).values())
    for pattern in [
        r"sluice_requests_total\{[^}]*outcome=~?\"[^\"]*(denied|concurrency_denied)",  # lockout refusals
        r"sluice_lease_admitted_total",
        r"sluice_leases_granted_total",
        r"sluice_lease_units_held",
        r"sluice_store_fallback\b",
        r"sluice_upstream_errors_total",
        r"sluice_memory_store_evictions_total",
        r"sluice_redis_calls_total",
        r"histogram_quantile\(0\.99, sum by \(le, command\) \(rate\(sluice_redis_call_duration_seconds_bucket",
        r"sum by \(source\) \(rate\(sluice_decision_duration_seconds_count",
    ]:
        assert re.search(pattern, joined), pattern


# --- the alert rules --------------------------------------------------------


def test_prometheus_rule_renders_the_plain_rules_file() -> None:
    r = render(CASES["all-options"])
    rule = r.one("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    plain = yaml.safe_load(RULES_FILE.read_text())
    assert rule["spec"] == plain
    # The chart's copy is the file itself, byte for byte.
    assert CHART_RULES.read_bytes() == RULES_FILE.read_bytes()
    # Annotations reach Prometheus unexpanded: `{{ $labels.pod }}` is its own.
    summaries = [a["annotations"]["summary"] for g in rule["spec"]["groups"] for a in g["rules"]]
    assert all("{{ $labels.pod }}" in s for s in summaries)


def test_prometheus_rule_is_off_by_default() -> None:
    assert render({}).all("PrometheusRule") == []


def test_alert_rules_name_only_metrics_sluice_exports() -> None:
    rules = [rule for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for rule in g["rules"]]
    assert len(rules) >= 10
    for rule in rules:
        named = re.findall(r"\bsluice_[a-z_]+", rule["expr"])
        assert named, rule["alert"]
        unknown = [m for m in named if m not in SLUICE_SERIES]
        assert unknown == [], f"{rule['alert']}: {unknown}"
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}


def test_alert_rules_pass_promtool_unit_tests() -> None:
    """`promtool test rules`: every alert has a case where it fires."""
    tests = yaml.safe_load((RULES_FILE.parent / "sluice-rules.test.yaml").read_text())
    fired = {
        t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"] if t.get("exp_alerts")
    }
    alerts = {rule["alert"] for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for rule in g["rules"]}
    assert alerts == fired
    result = subprocess.run(
        ["promtool", "test", "rules", "sluice-rules.test.yaml"],
        cwd=RULES_FILE.parent,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


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


# --- rollout: the grace period covers sluice's shutdown ---------------------


def duration_seconds(text: str) -> float:
    """A duration as sluice.yaml writes it ("500ms", "5s", "1m30s")."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+)\s*(ms|s|m|h)", text)
    assert parts and re.fullmatch(r"(\s*\d+\s*(ms|s|m|h)\s*)+", text), text
    return sum(int(n) * units[u] for n, u in parts)


def shutdown_values(tgps: int, delay: str = "5s", grace: str = "20s", pre_stop: int = 0) -> dict[str, Any]:
    return {
        "terminationGracePeriodSeconds": tgps,
        "sluice": {
            "preStopSleepSeconds": pre_stop,
            "config": {"server": {"shutdown_delay": delay, "shutdown_grace": grace}},
        },
    }


@pytest.mark.parametrize(
    "values",
    [
        shutdown_values(26),
        shutdown_values(30, delay="500ms", grace="29s"),
        shutdown_values(96, delay="1m30s", grace="5s"),
        shutdown_values(30, pre_stop=4),
        shutdown_values(2, delay="0s", grace="1s"),
    ],
)
def test_grace_period_longer_than_shutdown_renders(values: dict[str, Any]) -> None:
    r = render(values)
    server = r.config["server"]
    assert r.pod["spec"]["terminationGracePeriodSeconds"] == values["terminationGracePeriodSeconds"]
    needed = duration_seconds(server["shutdown_delay"]) + duration_seconds(server["shutdown_grace"])
    assert values["terminationGracePeriodSeconds"] > needed + values["sluice"]["preStopSleepSeconds"]


@pytest.mark.parametrize(
    ("values", "total"),
    [
        (shutdown_values(25), "= 25s"),
        (shutdown_values(20), "= 25s"),
        (shutdown_values(30, delay="1m"), "= 80s"),
        (shutdown_values(95, delay="1m30s", grace="5s"), "= 95s"),
        (shutdown_values(30, delay="500ms", grace="29s", pre_stop=1), "= 30.5s"),
        (shutdown_values(30, pre_stop=5), "= 30s"),
        (shutdown_values(3600, grace="1h"), "= 3605s"),
        ({**SIDECAR_ONLY, **shutdown_values(25)}, "= 35s"),  # with the app's 10 s first
    ],
)
def test_grace_period_not_longer_than_shutdown_is_refused(values: dict[str, Any], total: str) -> None:
    refused = (helm.HelmRenderError, helm.HelmValuesError)
    with helm.Chart.load(CHART) as chart, pytest.raises(refused) as err:
        chart.render(values, name="rel")
    message = str(err.value)
    assert "terminationGracePeriodSeconds" in message
    assert "shutdown_delay" in message and "shutdown_grace" in message
    assert total in message


# --- checksum/sluice-restart: restart-only keys roll the pods ----------------


def pod_annotations(r: Render) -> dict[str, str]:
    """The annotations sluice's pods get: the chart's Deployment, or the pod
    patch for an existing one."""
    if r.values["mode"] == "sidecar-only":
        return pod_patch(r)["spec"]["template"]["metadata"]["annotations"]
    return r.pod["metadata"]["annotations"]


def restart_checksum(values: dict[str, Any]) -> tuple[str, str]:
    """(checksum/sluice-restart, the rendered sluice.yaml)."""
    r = render(values)
    checksum = pod_annotations(r)["checksum/sluice-restart"]
    assert re.fullmatch(r"[0-9a-f]{64}", checksum)
    return checksum, r.config_text


def with_values(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` merged into `base`, maps recursively (as Helm merges values)."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = with_values(merged[key], value)
        else:
            merged[key] = value
    return merged


def sluice_config(config: dict[str, Any]) -> dict[str, Any]:
    return {"sluice": {"config": config}}


REDIS = sluice_config({"store": {"kind": "redis", "url": "redis://redis:6379"}})

# Changes sluice applies on reload: the pods must not roll.
HOT_CHANGES = {
    "policy limit": sluice_config({"policies": {"api": {"limit": 500}}}),
    "new policy": sluice_config({"policies": {"burst": {"algorithm": "fixed-window", "limit": 5, "window": "1s"}}}),
    "route": sluice_config({"routes": [{"name": "all", "match": {"path_prefix": "/"}, "policy": "api"}]}),
    "default": sluice_config({"default": {"policy": "none"}}),
    "identity": sluice_config({"identity": {"trusted_proxies": ["10.0.0.0/8"]}}),
    "store.budget": sluice_config({"store": {"budget": "40ms"}}),
    "store.on_failure": sluice_config({"store": {"on_failure": "allow"}}),
    "upstream.timeout": sluice_config({"upstream": {"timeout": "10s"}}),
    "server.paths": sluice_config({"server": {"paths": {"merge_slashes": False}}}),
    "server.body_idle_timeout": sluice_config({"server": {"body_idle_timeout": "10s"}}),
}

# Changes sluice reads only at start: the pods must roll.
RESTART_CHANGES = {
    "store.kind": REDIS,
    "store.max_entries": sluice_config({"store": {"max_entries": 1000}}),
    "server.shutdown_grace": sluice_config({"server": {"shutdown_grace": "15s"}}),
    "server.shutdown_delay": sluice_config({"server": {"shutdown_delay": "3s"}}),
    "server.max_connections": sluice_config({"server": {"max_connections": 5000}}),
    "server.http2": sluice_config({"server": {"http2": {"max_concurrent_streams": 64}}}),
    "server.request_heads": sluice_config({"server": {"request_heads": {"total": 8388608}}}),
    "upstream.connect_timeout": sluice_config({"upstream": {"connect_timeout": "2s"}}),
    "traffic port": {"sluice": {"ports": {"traffic": 8081}}},
    "pseudonym key secret": {"sluice": {"secrets": {"pseudonymKey": {"secretName": "keys"}}}},
    "secret key name": {"sluice": {"secrets": {"pseudonymKey": {"secretName": "keys", "key": "v2"}}}},
    "extra secret": {"sluice": {"secrets": {"extra": [{"name": "TOKEN", "secretName": "s", "key": "k"}]}}},
    "secretsChecksum": {"sluice": {"secretsChecksum": "sha256:1234"}},
    "image": {"sluice": {"image": {"tag": "0.2.0"}}},
}

MODES = {"app": {}, "sidecar-only": SIDECAR_ONLY}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("change", list(HOT_CHANGES))
def test_restart_checksum_ignores_hot_keys(mode: str, change: str) -> None:
    before, config_before = restart_checksum(MODES[mode])
    after, config_after = restart_checksum(with_values(MODES[mode], HOT_CHANGES[change]))
    assert config_after != config_before, "the change must reach sluice.yaml"
    assert after == before


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("change", list(RESTART_CHANGES))
def test_restart_checksum_follows_restart_only_keys(mode: str, change: str) -> None:
    before, _ = restart_checksum(MODES[mode])
    after, _ = restart_checksum(with_values(MODES[mode], RESTART_CHANGES[change]))
    assert after != before


def test_restart_checksum_follows_redis_keys_not_hot_store_keys() -> None:
    redis, _ = restart_checksum(REDIS)
    pool, _ = restart_checksum(with_values(REDIS, sluice_config({"store": {"pool_size": 4}})))
    retry, _ = restart_checksum(with_values(REDIS, sluice_config({"store": {"failure_retry_after": "3s"}})))
    assert pool != redis
    assert retry == redis


def readme_hot_reload() -> str:
    text = OPERATIONS_DOC.read_text()
    start = text.index("- **Hot reload**")
    return text[start : text.index("- **Shutdown**", start)]


def test_restart_checksum_keys_are_the_documented_restart_only_keys() -> None:
    """The template's key lists are those of the product's "Hot reload" list."""
    doc = readme_hot_reload()
    applied, restart = doc.split("need a\n  restart", 1)
    helpers = HELPERS.read_text()

    server_doc = re.search(r"- `server`: (.*?);", restart, re.DOTALL)
    assert server_doc
    server_tpl = re.search(r'"server" \(pick \$server ([^)]*)\)', helpers)
    assert server_tpl
    assert re.findall(r'"([a-z_0-9]+)"', server_tpl.group(1)) == re.findall(r"`([a-z_0-9]+)`", server_doc.group(1))

    upstream_tpl = re.search(r'"upstream" \(pick \$upstream ([^)]*)\)', helpers)
    assert upstream_tpl
    upstream_doc = re.findall(r"`upstream\.([a-z_]+)`", restart)
    assert re.findall(r'"([a-z_]+)"', upstream_tpl.group(1)) == upstream_doc

    # Every store key but the reloadable ones needs a restart.
    store_tpl = re.search(r'"store" \(omit \$store ([^)]*)\)', helpers)
    assert store_tpl
    store_hot = re.findall(r"`store\.([a-z_]+)`", applied)
    assert sorted(re.findall(r'"([a-z_]+)"', store_tpl.group(1))) == sorted(store_hot)


def restart_only_keys() -> dict[str, list[str]]:
    """`sluice keys`: the restart-only keys of each section, in order."""
    binary = sluice_bin()
    assert binary.is_file(), f"sluice binary not found at {binary} (build it or set SLUICE_BIN)"
    out = subprocess.run([str(binary), "keys"], capture_output=True, text=True, timeout=60, check=True).stdout
    keys: dict[str, list[str]] = {}
    for line in out.splitlines():
        path, rest = line.split(": ", 1)
        if "# restart;" in rest:
            section, name = path.split(".", 2)[:2]
            if name not in keys.setdefault(section, []):
                keys[section].append(name)
    return keys


def test_restart_checksum_keys_are_the_tables_restart_only_keys() -> None:
    """The template's key lists are those sluice's key table says a reload refuses."""
    restart = restart_only_keys()
    helpers = HELPERS.read_text()
    server_tpl = re.search(r'"server" \(pick \$server ([^)]*)\)', helpers)
    assert server_tpl
    assert sorted(re.findall(r'"([a-z_0-9]+)"', server_tpl.group(1))) == sorted(restart["server"])
    upstream_tpl = re.search(r'"upstream" \(pick \$upstream ([^)]*)\)', helpers)
    assert upstream_tpl
    assert re.findall(r'"([a-z_]+)"', upstream_tpl.group(1)) == restart["upstream"]
    # The store's reloadable keys are omitted; every other one is restart-only.
    out = subprocess.run([str(sluice_bin()), "keys"], capture_output=True, text=True, timeout=60, check=True).stdout
    store_hot = [line.split(": ", 1)[0].split(".")[1] for line in out.splitlines()
                 if line.startswith("store.") and "# reload;" in line]
    store_tpl = re.search(r'"store" \(omit \$store ([^)]*)\)', helpers)
    assert store_tpl
    assert sorted(re.findall(r'"([a-z_]+)"', store_tpl.group(1))) == sorted(store_hot)
    assert "store" not in restart or "budget" not in restart["store"]


# --- sidecar-only mode: sluice added to a Deployment the team has -----------


def kubectl(*args: str) -> str:
    binary = os.environ.get("KUBECTL")
    assert binary, "KUBECTL must name the kubectl binary (scripts/test-chart.sh installs one)"
    result = subprocess.run(
        [binary, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"kubectl {' '.join(args)} failed:\n{result.stderr}"
    return result.stdout


def strategic_merge(base: dict[str, Any], patch: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """`patch` applied to `base` as `kubectl patch --type strategic` does."""
    base_file = tmp_path / "base.json"
    patch_file = tmp_path / "patch.json"
    base_file.write_text(json.dumps(base))
    patch_file.write_text(json.dumps(patch))
    out = kubectl(
        "patch", "--local", "-f", str(base_file), "--type", "strategic", "--patch-file", str(patch_file), "-o", "json"
    )
    return json.loads(out)


def pod_patch(r: Render) -> dict[str, Any]:
    return yaml.safe_load(r.one("ConfigMap", f"{r.fullname}-pod-patch")["data"]["patch.yaml"])


def legacy_deployment() -> dict[str, Any]:
    return yaml.safe_load(LEGACY_DEPLOYMENT.read_text())


def legacy_service() -> dict[str, Any]:
    return yaml.safe_load(LEGACY_SERVICE.read_text())


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def validate_all(docs: list[dict[str, Any]]) -> None:
    problems = []
    for doc in docs:
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                problems.append(f"{doc['kind']}/{doc['metadata']['name']} against {version}: {path}: {e.message}")
    assert problems == []


def assert_sluice_added(
    merged: dict[str, Any],
    services: list[dict[str, Any]],
    config_map: dict[str, Any],
    tmp_path: Path,
) -> None:
    """sluice is in the legacy Deployment's pods as a native sidecar in front
    of the application, and nothing of the application changed."""
    validate_all([merged, *services, config_map])
    legacy = legacy_deployment()
    before = legacy["spec"]["template"]["spec"]
    spec = merged["spec"]["template"]["spec"]
    config_text = config_map["data"]["sluice.yaml"]
    config = yaml.safe_load(config_text)

    # The application's own pod, as its team wrote it (sluice's own
    # annotation and label added, nothing of the application's changed).
    assert merged["spec"]["selector"] == legacy["spec"]["selector"]
    labels = merged["spec"]["template"]["metadata"]["labels"]
    assert legacy["spec"]["template"]["metadata"]["labels"].items() <= labels.items()
    assert set(labels) - set(legacy["spec"]["template"]["metadata"]["labels"]) <= {"sluice/sidecar"}
    annotations = merged["spec"]["template"]["metadata"].get("annotations", {})
    assert legacy["spec"]["template"]["metadata"]["annotations"].items() <= annotations.items()
    assert set(annotations) - set(legacy["spec"]["template"]["metadata"]["annotations"]) <= {"checksum/sluice-restart"}
    assert spec["containers"] == before["containers"]
    assert [c for c in spec["initContainers"] if c["name"] != "sluice"] == before["initContainers"]
    assert spec["securityContext"] == before["securityContext"]
    assert [v for v in spec["volumes"] if v["name"] != "sluice-config"] == before["volumes"]
    for key in before.keys() - {"initContainers", "volumes", "terminationGracePeriodSeconds"}:
        assert spec[key] == before[key], key

    # sluice: an init container that keeps running, started (and healthy)
    # before the application.
    [sluice] = [c for c in spec["initContainers"] if c["name"] == "sluice"]
    assert sluice["restartPolicy"] == "Always"
    assert not [c for c in spec["containers"] if c["name"] == "sluice"]
    assert_restricted(sluice, spec["securityContext"])
    traffic = port_of(config["server"]["listen"])
    admin = port_of(config["server"]["admin"])
    assert {p["name"]: p["containerPort"] for p in sluice["ports"]} == {"sluice": traffic, "sluice-metrics": admin}
    app_ports = {p["containerPort"] for c in spec["containers"] + before["initContainers"] for p in c.get("ports", [])}
    assert not app_ports & {traffic, admin}, "sluice's ports collide with the application's"
    startup = sluice["startupProbe"]["httpGet"]
    assert startup["path"] == "/healthz"
    assert container_port(sluice, startup["port"]) == admin
    assert sluice["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container_port(sluice, sluice["readinessProbe"]["httpGet"]["port"]) == admin

    # Its configuration, mounted as a directory (reloads reach it).
    [mount] = [m for m in sluice["volumeMounts"] if m["mountPath"] == "/etc/sluice"]
    assert mount["readOnly"] is True and "subPath" not in mount
    [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert sluice["args"][:3] == ["run", "--config", "/etc/sluice/sluice.yaml"]
    assert not [m for c in spec["containers"] for m in c.get("volumeMounts", []) if m["name"] == mount["name"]]

    # sluice forwards to the application over loopback, and the Services'
    # http ports reach sluice; any other port reaching the application is
    # one the Service names in sluice/bypass-ports.
    [web] = [p for c in before["containers"] for p in c["ports"] if p["name"] == "web"]
    assert config["upstream"]["url"] == f"http://127.0.0.1:{web['containerPort']}"
    assert services
    for service in services:
        assert service["spec"]["selector"].items() <= merged["spec"]["template"]["metadata"]["labels"].items()
        bypass = service["metadata"].get("annotations", {}).get("sluice/bypass-ports", "").split(",")
        for p in service["spec"]["ports"]:
            if p.get("name") in bypass:
                continue
            assert container_port(sluice, p["targetPort"]) == traffic, service["metadata"]["name"]

    # The kubelet waits long enough for the application to stop and then
    # sluice, a native sidecar, to drain.
    server = config["server"]
    needed = duration_seconds(server.get("shutdown_delay", "5s")) + duration_seconds(server.get("shutdown_grace", "20s"))
    needed += sluice.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    [app] = [c for c in before["containers"] if c["name"] == "shop"]
    needed += int(re.search(r"sleep (\d+)", " ".join(app["lifecycle"]["preStop"]["exec"]["command"])).group(1))
    assert spec["terminationGracePeriodSeconds"] > needed

    result = check_manifests([merged, *services], tmp_path)
    assert result.returncode == 0, f"sluice check-manifests failed:\n{result.stdout}\n{result.stderr}"

    result = sluice_check(config_text, tmp_path)
    assert result.returncode == 0, f"sluice check failed:\n{result.stdout}\n{result.stderr}"


def test_sidecar_only_renders_no_deployment() -> None:
    r = render(SIDECAR_ONLY)
    assert sorted((d["kind"], d["metadata"]["name"]) for d in r.docs) == [
        ("ConfigMap", "rel-sluice-config"),
        ("ConfigMap", "rel-sluice-pod-patch"),
        ("Service", "rel-sluice"),
    ]
    service = r.one("Service")
    assert service["spec"]["selector"] == {"app": "shop"}
    assert [p["targetPort"] for p in service["spec"]["ports"]] == [8080]
    assert r.config["upstream"]["url"] == "http://127.0.0.1:3000"
    validate_all(r.docs)
    assert "patch deployment" in r.notes and f"{r.fullname}-pod-patch" in r.notes


def test_sidecar_only_optional_resources_select_the_teams_pods() -> None:
    all_options = CASES["all-options"]
    r = render({**all_options, **SIDECAR_ONLY, "terminationGracePeriodSeconds": 60})
    selector = SIDECAR_ONLY["sidecarOnly"]["selector"]
    assert not r.all("Deployment") and not r.all("ServiceAccount")
    assert r.one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == selector
    assert r.one("NetworkPolicy")["spec"]["podSelector"]["matchLabels"] == selector
    assert r.one("Service", f"{r.fullname}-metrics")["spec"]["selector"] == selector
    sluice = pod_patch(r)["spec"]["template"]["spec"]["initContainers"][0]
    env = {e["name"] for e in sluice["env"]}
    assert {"SLUICE_PSEUDONYM_KEY", "REDIS_URL", "REDIS_PASSWORD"} <= env
    volumes = {v["name"] for v in pod_patch(r)["spec"]["template"]["spec"]["volumes"]}
    assert {"sluice-config", "redis-ca"} <= volumes


def test_sidecar_only_patch_adds_sluice_to_legacy_deployment(tmp_path: Path) -> None:
    r = render(SIDECAR_ONLY)
    patch = pod_patch(r)
    merged = strategic_merge(legacy_deployment(), patch, tmp_path)
    config_map = r.one("ConfigMap", f"{r.fullname}-config")
    assert_sluice_added(merged, [r.one("Service")], config_map, tmp_path)
    annotations = merged["spec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/sluice-restart"] == pod_annotations(r)["checksum/sluice-restart"]
    # The application's own scrape annotations stay its own.
    assert annotations["prometheus.io/port"] == "9100"
    assert not [k for k in pod_annotations(r) if k.startswith("prometheus.io/")]
    assert merged["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 60


# --- the Kustomize component ------------------------------------------------


def test_kustomize_example_adds_sluice_to_legacy_deployment(tmp_path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(kubectl("kustomize", str(EXAMPLE))) if d]
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "Deployment", "NetworkPolicy", "NetworkPolicy", "Service"]
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    [config_map] = [d for d in docs if d["kind"] == "ConfigMap"]
    services = [d for d in docs if d["kind"] == "Service"]
    assert_sluice_added(deployment, services, config_map, tmp_path)
    # The example's own configuration replaced the component's.
    own = (EXAMPLE / "sluice-config" / "sluice.yaml").read_text()
    assert config_map["data"]["sluice.yaml"] == own
    # No hash suffix: a configuration change reaches the mounted file and is
    # reloaded, instead of renaming the ConfigMap and rolling the pods.
    assert config_map["metadata"]["name"] == "sluice-config"
    [sluice] = [c for c in deployment["spec"]["template"]["spec"]["initContainers"] if c["name"] == "sluice"]
    assert sluice["image"] == "registry.example.com/platform/sluice:0.1.0"
    validate_all([d for d in docs if d["kind"] == "NetworkPolicy"])
    # The whole rendering passes, without a warning: the application's
    # metrics port is admitted by a policy that says so.
    result = check_manifests(docs, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 errors, 0 warnings" in result.stdout


def test_kustomize_component_starting_config_is_valid(tmp_path: Path) -> None:
    """The component's own sluice.yaml: what a team starts from."""
    text = (KUSTOMIZE / "sluice-sidecar" / "sluice.yaml").read_text()
    result = sluice_check(text, tmp_path)
    assert result.returncode == 0, f"sluice check failed:\n{result.stdout}\n{result.stderr}"
    config = yaml.safe_load(text)
    patch = yaml.safe_load((KUSTOMIZE / "sluice-sidecar" / "sidecar.yaml").read_text())
    [sluice] = patch["spec"]["template"]["spec"]["initContainers"]
    ports = {p["name"]: p["containerPort"] for p in sluice["ports"]}
    listen, admin = port_of(config["server"]["listen"]), port_of(config["server"]["admin"])
    assert ports == {"sluice": listen, "sluice-metrics": admin}
    # The NetworkPolicy component admits those two numbers.
    policy = yaml.safe_load((KUSTOMIZE / "sluice-network-policy" / "network-policy.yaml").read_text())
    admitted = sorted(p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"])
    assert admitted == sorted(ports.values())


# --- docs/KUBERNETES.md's copy-paste snippet- ----------------------------------------


def readme_snippets() -> list[dict[str, Any]]:
    text = KUBERNETES_DOC.read_text()
    start = text.index("\n## Adding sluice to a Deployment you already have\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    blocks = re.findall(r"```yaml\n(.*?)^ *```", section, re.DOTALL | re.MULTILINE)
    return [yaml.safe_load(textwrap.dedent(block)) for block in blocks]


def test_readme_snippet_adds_sluice_to_legacy_deployment(tmp_path: Path) -> None:
    snippets = readme_snippets()
    [config_map] = [s for s in snippets if s.get("kind") == "ConfigMap"]
    [pod] = [s for s in snippets if "template" in s.get("spec", {})]
    [service] = [s for s in snippets if "ports" in s.get("spec", {})]
    assert len(snippets) == 3
    merged = strategic_merge(legacy_deployment(), pod, tmp_path)
    merged_service = strategic_merge(legacy_service(), service, tmp_path)
    assert_sluice_added(merged, [merged_service], config_map, tmp_path)
    # The snippet's container is the component's: one sidecar definition.
    component = yaml.safe_load((KUSTOMIZE / "sluice-sidecar" / "sidecar.yaml").read_text())
    assert pod["spec"]["template"]["spec"]["initContainers"] == component["spec"]["template"]["spec"]["initContainers"]


# --- the README's first configurations ---------------------------------------


def test_the_readmes_first_configurations_load(tmp_path: Path) -> None:
    """Both files of "A first configuration" pass `sluice check`."""
    text = README.read_text()
    start = text.index("## A first configuration")
    section = text[start : text.index("\n## ", start + 1)]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 2
    for block in blocks:
        result = sluice_check(block, tmp_path)
        assert result.returncode == 0, result.stderr
        assert "everything" in result.stdout


# --- manifests that check themselves ------------------------------------------


def test_every_chart_rendering_passes_check_manifests(case: tuple[str, Render], tmp_path: Path) -> None:
    _, r = case
    result = check_manifests(r.docs, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # The chart's NetworkPolicy (on by default in app mode) leaves nothing to warn about.
    assert "0 errors, 0 warnings" in result.stdout, result.stdout


def test_check_manifests_refuses_a_service_around_sluice(tmp_path: Path) -> None:
    """The acceptance above means something only if the check can refuse."""
    r = render({})
    around = json.loads(json.dumps(r.one("Service")))
    around["metadata"]["name"] = "around"
    around["spec"]["ports"][0]["targetPort"] = r.values["app"]["port"]
    result = check_manifests([*r.docs, around], tmp_path)
    assert result.returncode == 2, result.stdout
    assert "Service/around" in result.stdout and "directly, around sluice" in result.stdout


def relative_component(tmp_path: Path, name: str) -> str:
    """`name` under deploy/kustomize, as a path relative to `tmp_path`
    (Kustomize loads components by relative path only)."""
    return os.path.relpath(KUSTOMIZE / name, tmp_path)


def overlay(tmp_path: Path, service: dict[str, Any], deployment: dict[str, Any], extra: str = "") -> Path:
    (tmp_path / "service.yaml").write_text(yaml.safe_dump(service))
    (tmp_path / "deployment.yaml").write_text(yaml.safe_dump(deployment))
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [deployment.yaml, service.yaml]\n"
        f"components: [{relative_component(tmp_path, 'sluice-sidecar')}]\n" + extra
    )
    return tmp_path


def kustomize(path: Path) -> subprocess.CompletedProcess[str]:
    binary = os.environ.get("KUBECTL")
    assert binary, "KUBECTL must name the kubectl binary (scripts/test-chart.sh installs one)"
    return subprocess.run([binary, "kustomize", str(path)], capture_output=True, text=True, timeout=120, check=False)


def test_kustomize_component_patches_the_http_port_by_name(tmp_path: Path) -> None:
    """A Service listing its metrics port before `http`: the http port ends
    on sluice, the metrics port stays the application's."""
    service = legacy_service()
    service["spec"]["ports"] = [
        {"name": "metrics", "port": 9100, "targetPort": "metrics", "protocol": "TCP"},
        {"name": "http", "port": 80, "targetPort": "web"},
    ]
    service["metadata"]["annotations"] = {"sluice/bypass-ports": "metrics"}
    built = kustomize(overlay(tmp_path, service, legacy_deployment()))
    assert built.returncode == 0, built.stderr
    docs = [d for d in yaml.safe_load_all(built.stdout) if d]
    [patched] = [d for d in docs if d["kind"] == "Service"]
    ports = {p["name"]: p for p in patched["spec"]["ports"]}
    assert ports["http"]["targetPort"] == "sluice"
    assert ports["http"]["port"] == 80
    assert ports["metrics"] == service["spec"]["ports"][0]
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    [sluice] = [c for c in deployment["spec"]["template"]["spec"]["initContainers"] if c["name"] == "sluice"]
    assert container_port(sluice, "sluice") == 8080
    # Nothing of the build is the component's helper object.
    assert not [d for d in docs if d["kind"] == "SluiceSidecar"]
    validate_all(docs)
    result = check_manifests(docs, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "port",
    [
        {"name": "web", "port": 80, "targetPort": "web"},  # no port named http
        {"name": "http", "port": 80},  # no targetPort to replace
        {"name": "http", "port": 80, "targetPort": 3000},  # a number: Kustomize keeps the field's type
    ],
)
def test_kustomize_component_refuses_what_it_cannot_patch(port: dict[str, Any], tmp_path: Path) -> None:
    service = legacy_service()
    service["spec"]["ports"] = [port]
    built = kustomize(overlay(tmp_path, service, legacy_deployment()))
    assert built.returncode != 0, built.stdout
    assert "targetPort" in built.stderr or "!!int" in built.stderr, built.stderr


def test_a_label_added_by_the_overlay_fails_the_check(tmp_path: Path) -> None:
    """`labels:` runs after components: the ConfigMap is generated, the
    Deployment and Service are left as they were, and Kustomize exits 0.
    check-manifests refuses it."""
    def unlabelled(doc: dict[str, Any]) -> dict[str, Any]:
        doc["metadata"]["labels"].pop("sluice/sidecar")
        return doc

    extra = "labels:\n  - pairs: {sluice/sidecar: enabled}\n"
    built = kustomize(overlay(tmp_path, unlabelled(legacy_service()), unlabelled(legacy_deployment()), extra))
    assert built.returncode == 0, built.stderr
    docs = [d for d in yaml.safe_load_all(built.stdout) if d]
    assert "sluice-config" in [d["metadata"]["name"] for d in docs]
    result = check_manifests(docs, tmp_path)
    assert result.returncode == 2, result.stdout
    assert "Deployment/shop" in result.stdout
    assert "labelled sluice/sidecar: enabled but runs no `sluice` container" in result.stdout


def test_kustomize_component_keeps_the_apps_annotations() -> None:
    docs = [d for d in yaml.safe_load_all(kubectl("kustomize", str(EXAMPLE))) if d]
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations == legacy_deployment()["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "9100"


def test_kustomize_network_policy_admits_only_sluice_ports() -> None:
    docs = [d for d in yaml.safe_load_all(kubectl("kustomize", str(EXAMPLE))) if d]
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    [policy] = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "sluice-sidecar"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    admitted = sorted(p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"])
    assert admitted == [8080, 9901]
    assert all("from" not in rule for rule in policy["spec"]["ingress"])


# --- the application's pod keeps what it had, sluice's own names -------------


def test_app_mode_keeps_the_apps_own_prometheus_annotations() -> None:
    own = {"prometheus.io/scrape": "true", "prometheus.io/port": "9100"}
    r = render({"podAnnotations": own})
    annotations = r.pod["metadata"]["annotations"]
    assert {k: v for k, v in annotations.items() if k.startswith("prometheus.io/")} == own
    # Without its own, the chart's pod is scraped on sluice's admin port.
    assert render({}).pod["metadata"]["annotations"]["prometheus.io/port"] == "9901"


def test_sluice_ports_are_named_sluice_and_sluice_metrics(case: tuple[str, Render]) -> None:
    _, r = case
    ports = r.values["sluice"]["ports"]
    assert {p["name"]: p["containerPort"] for p in r.sluice["ports"]} == {
        "sluice": ports["traffic"],
        "sluice-metrics": ports["admin"],
    }
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert r.sluice[probe]["httpGet"]["port"] == "sluice-metrics"
    patch = pod_patch(render(SIDECAR_ONLY))["spec"]["template"]["spec"]["initContainers"][0]
    assert [p["name"] for p in patch["ports"]] == ["sluice", "sluice-metrics"]


def test_pod_monitor_scrapes_sluice_metrics_port() -> None:
    for values in (CASES["all-options"], {**SIDECAR_ONLY, "metrics": {"podMonitor": {"enabled": True}}}):
        r = render(values)
        monitor = r.one("PodMonitor")
        [endpoint] = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["port"] == "sluice-metrics" and endpoint["path"] == "/metrics"
        if r.values["mode"] == "app":
            assert monitor["spec"]["selector"]["matchLabels"].items() <= r.pod["metadata"]["labels"].items()
        else:
            assert monitor["spec"]["selector"]["matchLabels"] == SIDECAR_ONLY["sidecarOnly"]["selector"]


def test_network_policy_on_by_default_only_where_the_chart_owns_the_pod() -> None:
    r = render({})
    policy = r.one("NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= r.pod["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    admitted = sorted(p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"])
    assert admitted == [8080, 9901]
    assert r.values["app"]["port"] not in admitted
    # sidecar-only: the pod is the team's; off unless asked for, and then
    # with the extra rules as written.
    assert render(SIDECAR_ONLY).all("NetworkPolicy") == []
    extra = [{"ports": [{"port": 9100, "protocol": "TCP"}], "from": [{"namespaceSelector": {}}]}]
    on = render({**SIDECAR_ONLY, "networkPolicy": {"enabled": True, "extraIngress": extra}})
    policy = on.one("NetworkPolicy")
    assert policy["spec"]["ingress"][2:] == extra
    assert policy["metadata"]["annotations"]["sluice/bypass-ports"] == "9100"
    validate_all([policy])


# --- shutdown: terminationGracePeriodSeconds from the app's stop and sluice's --


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        # Regular container: sluice stops beside the app, the longer counts.
        ({}, 30),
        ({"app": {"stopSeconds": 10}}, 30),
        ({"app": {"stopSeconds": 40}}, 45),
        # Native sidecar: SIGTERM reaches sluice only after the app exited.
        ({"sluice": {"nativeSidecar": True}}, 30),
        ({"sluice": {"nativeSidecar": True}, "app": {"stopSeconds": 15}}, 45),
        (
            {
                "sluice": {
                    "nativeSidecar": True,
                    "preStopSleepSeconds": 1,
                    "config": {"server": {"shutdown_delay": "500ms", "shutdown_grace": "29s"}},
                },
                "app": {"stopSeconds": 10},
            },
            46,  # 10 + 1 + 0.5 + 29 = 40.5, rounded up, + 5
        ),
        # sidecar-only is always native.
        ({**SIDECAR_ONLY, "app": {"port": 3000, "stopSeconds": 10}, "terminationGracePeriodSeconds": None}, 40),
    ],
)
def test_grace_period_is_computed_from_app_stop_and_sluice_shutdown(values: dict[str, Any], expected: int) -> None:
    r = render(values)
    if r.values["mode"] == "sidecar-only":
        assert pod_patch(r)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == expected
    else:
        assert r.pod["spec"]["terminationGracePeriodSeconds"] == expected


def test_native_sidecar_grace_period_refused_when_the_app_stop_does_not_fit() -> None:
    values = {"sluice": {"nativeSidecar": True}, "app": {"stopSeconds": 15}, "terminationGracePeriodSeconds": 40}
    refused = (helm.HelmRenderError, helm.HelmValuesError)
    with helm.Chart.load(CHART) as chart, pytest.raises(refused) as err:
        chart.render(values, name="rel")
    message = str(err.value)
    assert "app.stopSeconds (15)" in message and "= 40s" in message
    assert "only after the application has exited" in message
    # One second more fits.
    assert render({**values, "terminationGracePeriodSeconds": 41}).pod["spec"]["terminationGracePeriodSeconds"] == 41


# --- values.yaml, values.schema.json and the README agree ---------------------


def value_paths(values: dict[str, Any], prefix: str = "", depth: int = 2) -> list[str]:
    """Key paths of values.yaml down to `depth` (sluice.config is sluice's
    own configuration, documented with sluice; pass-through objects such as
    podSecurityContext are documented whole)."""
    paths = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        paths.append(path)
        if isinstance(value, dict) and value and depth > 1 and path != "sluice.config":
            paths.extend(value_paths(value, f"{path}.", depth - 1))
    return paths


def test_every_value_is_in_the_schema_and_the_readme() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    readme = (CHART / "README.md").read_text()
    missing_schema, missing_readme = [], []
    for path in value_paths(values):
        node = schema
        free_form = False
        for key in path.split("."):
            if "properties" not in node:
                free_form = True  # a pass-through object (a security context, a probe)
                break
            node = node["properties"].get(key)
            if node is None:
                missing_schema.append(path)
                break
        parent, _, last = path.rpartition(".")
        forms = [f"`{path}`", f"`{path}.", f"`.{last}`"] + ([f"`{parent}.*`"] if parent else [])
        if not free_form and not any(form in readme for form in forms):
            missing_readme.append(path)
    assert missing_schema == []
    assert missing_readme == [], missing_readme
