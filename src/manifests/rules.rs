//! The checks of `sluice check-manifests` over loaded objects.
//!
//! `sluice/bypass-ports` on a Service names its ports that reach the
//! application on purpose; on a NetworkPolicy, the ports it admits to the
//! application on purpose.

use std::fmt;

use serde_yaml::{Mapping, Value};

use super::mounted::mounted;
use super::objects::{at, pod, protocol, scalar, selects, Container, Object, Pod};
use super::{BYPASS_ANNOTATION, CONTAINER, METRICS_PORT, SIDECAR_LABEL, TRAFFIC_PORT};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Error,
    Warning,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub severity: Severity,
    /// `Kind/name (FILE, document N)`.
    pub object: String,
    pub message: String,
}

/// Everything found, and what was checked and found right.
#[derive(Debug, Default)]
pub struct Report {
    pub findings: Vec<Finding>,
    pub passed: Vec<String>,
}

impl Report {
    pub fn errors(&self) -> usize {
        self.count(Severity::Error)
    }

    pub fn warnings(&self) -> usize {
        self.count(Severity::Warning)
    }

    fn count(&self, severity: Severity) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity == severity)
            .count()
    }

    fn error(&mut self, object: &Object, message: String) {
        self.push(Severity::Error, object, message);
    }

    fn warn(&mut self, object: &Object, message: String) {
        self.push(Severity::Warning, object, message);
    }

    fn push(&mut self, severity: Severity, object: &Object, message: String) {
        self.findings.push(Finding {
            severity,
            object: format!("{} ({})", object.id(), object.origin),
            message,
        });
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in &self.passed {
            writeln!(f, "ok       {line}")?;
        }
        let mut findings: Vec<&Finding> = self.findings.iter().collect();
        findings.sort_by_key(|f| f.severity);
        for finding in findings {
            let word = match finding.severity {
                Severity::Error => "error  ",
                Severity::Warning => "warning",
            };
            writeln!(f, "{word}  {}: {}", finding.object, finding.message)?;
        }
        writeln!(
            f,
            "{} error{}, {} warning{}",
            self.errors(),
            plural(self.errors()),
            self.warnings(),
            plural(self.warnings())
        )
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// sluice's two ports in one pod, found by their names.
struct Sidecar {
    traffic: Option<u16>,
    metrics: Option<u16>,
}

/// Where a Service port's traffic goes in a pod.
#[derive(Debug, PartialEq, Eq)]
enum Reaches {
    SluiceTraffic,
    SluiceMetrics,
    /// Another container (its name), or a port no container declares
    /// (`None`): whatever listens there, the application.
    Around(Option<String>, u16),
    /// A name no container's port has: no endpoints at all.
    Nothing(String),
    /// A string that is no port name (`"8080"`): refused by the API server.
    Invalid(String),
}

pub fn check(objects: &[Object]) -> Report {
    let mut report = Report::default();
    let workloads: Vec<(&Object, Pod<'_>)> = objects
        .iter()
        .filter_map(|o| pod(o).map(|p| (o, p)))
        .collect();
    let mut with_sluice = 0;
    for (object, pod) in &workloads {
        let meant = object.label(SIDECAR_LABEL).as_deref() == Some("enabled")
            || pod.labels.get(SIDECAR_LABEL).and_then(scalar).as_deref() == Some("enabled");
        let containers = pod.containers();
        match containers.iter().find(|c| c.name == CONTAINER) {
            Some(sluice) => {
                with_sluice += 1;
                check_pod(&mut report, object, sluice, &containers);
                check_config(&mut report, object, pod, sluice, objects);
            }
            None if meant => report.error(
                object,
                format!(
                    "labelled {SIDECAR_LABEL}: enabled but runs no `{CONTAINER}` container: the label was added after the \
                     sidecar patch ran (e.g. by an overlay's `labels:`; put it in the base the component patches) or no patch targeted it"
                ),
            ),
            None => {}
        }
    }
    if with_sluice == 0 {
        report.findings.push(Finding {
            severity: Severity::Error,
            object: "input".into(),
            message: format!(
                "no workload runs a `{CONTAINER}` container: check the whole rendering, the workloads with the Services that select them"
            ),
        });
    }
    for service in objects.iter().filter(|o| o.kind == "Service") {
        check_service(&mut report, service, &workloads);
    }
    for (object, pod) in &workloads {
        let containers = pod.containers();
        if containers.iter().any(|c| c.name == CONTAINER) {
            check_isolation(&mut report, object, pod, &containers, objects);
        }
    }
    report
}

fn sidecar(sluice: &Container<'_>) -> Sidecar {
    let named = |name: &str| {
        sluice
            .ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
            .map(|p| p.number)
    };
    Sidecar {
        traffic: named(TRAFFIC_PORT),
        metrics: named(METRICS_PORT),
    }
}

fn check_pod(report: &mut Report, object: &Object, sluice: &Container<'_>, all: &[Container<'_>]) {
    if sluice.init && !sluice.sidecar {
        report.error(
            object,
            format!("`{CONTAINER}` is an init container without restartPolicy: Always: it never exits, so the pod never starts"),
        );
    }
    let ports = sidecar(sluice);
    let Some(traffic) = ports.traffic else {
        report.error(
            object,
            format!("`{CONTAINER}` declares no port named `{TRAFFIC_PORT}` (its traffic port; `{METRICS_PORT}` is the admin and metrics port)"),
        );
        return;
    };
    for other in all.iter().filter(|c| c.name != CONTAINER) {
        for p in &other.ports {
            if Some(p.number) == Some(traffic) || Some(p.number) == ports.metrics {
                report.error(
                    object,
                    format!("container `{}` declares port {}, which is sluice's: the pod shares one network namespace", other.name, p.number),
                );
            }
            if p.name.as_deref() == Some(TRAFFIC_PORT) || p.name.as_deref() == Some(METRICS_PORT) {
                report.error(
                    object,
                    format!("container `{}` names a port `{}`, sluice's port name: a Service targeting it could reach either", other.name, p.name.as_deref().unwrap_or_default()),
                );
            }
        }
    }
    let metrics = ports.metrics.map_or_else(
        || "no metrics port".to_owned(),
        |m| format!("metrics on {m}"),
    );
    report.passed.push(format!(
        "{}: sluice{} on {traffic}, {metrics}",
        object.id(),
        if sluice.init { " (native sidecar)" } else { "" }
    ));
}

/// The ports sluice's configuration names against those its container
/// declares: a Service on the declared traffic port reaches nothing if
/// sluice listens elsewhere, and probes on the declared admin port fail.
fn check_config(
    report: &mut Report,
    object: &Object,
    pod: &Pod<'_>,
    sluice: &Container<'_>,
    objects: &[Object],
) {
    let Some(config) = mounted(sluice, pod, object, objects) else {
        return;
    };
    let ports = sidecar(sluice);
    let pairs = [
        ("server.listen", config.listen, TRAFFIC_PORT, ports.traffic),
        ("server.admin", config.admin, METRICS_PORT, ports.metrics),
    ];
    for (key, configured, name, declared) in pairs {
        if let (Some(configured), Some(declared)) = (configured, declared) {
            if configured != declared {
                report.error(
                    object,
                    format!("sluice's {key} in {} is port {configured}, but its container port `{name}` is {declared}", config.source),
                );
            }
        }
    }
    if let Some(upstream) = config.upstream {
        if [config.listen, config.admin].contains(&Some(upstream)) {
            report.error(
                object,
                format!("sluice's upstream.url in {} is its own port {upstream}: it would forward to itself", config.source),
            );
        }
    }
}

fn reaches(port: &Value, containers: &[Container<'_>], sidecar: &Sidecar) -> Reaches {
    let proto = protocol(port);
    let target = port.get("targetPort").or_else(|| port.get("port"));
    let by_number = |n: u16| {
        if Some(n) == sidecar.traffic {
            return Reaches::SluiceTraffic;
        }
        if Some(n) == sidecar.metrics {
            return Reaches::SluiceMetrics;
        }
        let owner = containers
            .iter()
            .find(|c| c.ports.iter().any(|p| p.number == n && p.protocol == proto));
        match owner {
            // sluice's own port under another name: the missing name is
            // reported with the pod.
            Some(c) if c.name == CONTAINER => Reaches::SluiceTraffic,
            _ => Reaches::Around(owner.map(|c| c.name.clone()), n),
        }
    };
    match target {
        Some(Value::Number(n)) => match n.as_u64().and_then(|n| u16::try_from(n).ok()) {
            Some(n) => by_number(n),
            None => Reaches::Invalid(n.to_string()),
        },
        Some(Value::String(name))
            if !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) =>
        {
            Reaches::Invalid(format!("\"{name}\""))
        }
        Some(Value::String(name)) => {
            // As the endpoints controller resolves a name: regular
            // containers, then native sidecars; the protocol must match.
            let found = containers
                .iter()
                .filter(|c| !c.init || c.sidecar)
                .flat_map(|c| c.ports.iter())
                .find(|p| p.name.as_deref() == Some(name.as_str()) && p.protocol == proto);
            match found {
                Some(p) => by_number(p.number),
                None => Reaches::Nothing(name.clone()),
            }
        }
        _ => Reaches::Invalid("no port".into()),
    }
}

fn bypassed(service: &Object) -> Vec<String> {
    service
        .annotation(BYPASS_ANNOTATION)
        .map(|list| {
            list.split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

fn check_service(report: &mut Report, service: &Object, workloads: &[(&Object, Pod<'_>)]) {
    let selector = at(&service.value, &["spec", "selector"])
        .and_then(Value::as_mapping)
        .cloned()
        .unwrap_or_default();
    let meant = service.label(SIDECAR_LABEL).as_deref() == Some("enabled");
    let ports: Vec<Value> = match at(&service.value, &["spec", "ports"]) {
        Some(Value::Sequence(list)) => list.clone(),
        _ => Vec::new(),
    };
    let bypass = bypassed(service);
    let mut selects_any = false;
    for (workload, pod) in workloads
        .iter()
        .filter(|(w, p)| w.shares_namespace(service) && selects(&selector, &p.labels))
    {
        selects_any = true;
        let containers = pod.containers();
        let Some(sluice) = containers.iter().find(|c| c.name == CONTAINER) else {
            if meant {
                report.error(
                    service,
                    format!(
                        "labelled {SIDECAR_LABEL}: enabled and selects {}, which runs no sluice",
                        workload.id()
                    ),
                );
            }
            continue;
        };
        let sidecar = sidecar(sluice);
        for port in &ports {
            let name = port.get("name").and_then(scalar);
            let number = port.get("port").and_then(scalar).unwrap_or_default();
            let label = name
                .clone()
                .map_or_else(|| number.clone(), |n| format!("{n} ({number})"));
            let allowed = bypass
                .iter()
                .any(|b| Some(b) == name.as_ref() || *b == number);
            match reaches(port, &containers, &sidecar) {
                Reaches::SluiceTraffic => report.passed.push(format!(
                    "{}: port {label} reaches sluice in {}",
                    service.id(),
                    workload.id()
                )),
                Reaches::SluiceMetrics => report.passed.push(format!(
                    "{}: port {label} reaches sluice's metrics port in {}",
                    service.id(),
                    workload.id()
                )),
                Reaches::Around(owner, n) if allowed => report.passed.push(format!(
                    "{}: port {label} reaches {} port {n} in {} directly, as {BYPASS_ANNOTATION} allows",
                    service.id(),
                    owner.map_or_else(|| "the undeclared".to_owned(), |o| format!("container `{o}`")),
                    workload.id()
                )),
                Reaches::Around(owner, n) => report.error(
                    service,
                    format!(
                        "port {label} reaches {} in {} directly, around sluice: point its targetPort at sluice's port `{TRAFFIC_PORT}`, \
                         or name the port in the annotation {BYPASS_ANNOTATION} if it is meant to (e.g. the application's metrics)",
                        owner.map_or_else(|| format!("port {n}, which no container declares,"), |o| format!("container `{o}` on port {n}")),
                        workload.id()
                    ),
                ),
                Reaches::Nothing(target) => report.error(
                    service,
                    format!("port {label} targets `{target}`, which no container of {} names: it has no endpoints", workload.id()),
                ),
                Reaches::Invalid(target) => report.error(
                    service,
                    format!("port {label} has targetPort {target}: a number, or the name of a container port"),
                ),
            }
        }
    }
    if meant && !selects_any {
        report.error(
            service,
            format!(
                "labelled {SIDECAR_LABEL}: enabled but selects no pod in the input: check it with the workload it selects"
            ),
        );
    }
}

/// NetworkPolicies of the pod's namespace that select it and restrict
/// ingress.
fn ingress_policies<'o>(
    objects: &'o [Object],
    workload: &Object,
    labels: &Mapping,
) -> Vec<&'o Object> {
    objects
        .iter()
        .filter(|o| o.kind == "NetworkPolicy" && o.shares_namespace(workload))
        .filter(|o| {
            let selector = at(&o.value, &["spec", "podSelector"]);
            let expressions = selector.and_then(|s| s.get("matchExpressions")).is_some();
            let labels_wanted = selector
                .and_then(|s| s.get("matchLabels"))
                .and_then(Value::as_mapping)
                .cloned()
                .unwrap_or_default();
            // An empty selector selects every pod of the namespace; match
            // expressions are not evaluated here (taken as selecting).
            expressions || labels_wanted.is_empty() || selects(&labels_wanted, labels)
        })
        .filter(|o| match at(&o.value, &["spec", "policyTypes"]) {
            Some(Value::Sequence(types)) => types.iter().any(|t| t.as_str() == Some("Ingress")),
            _ => true,
        })
        .collect()
}

fn check_isolation(
    report: &mut Report,
    workload: &Object,
    pod: &Pod<'_>,
    containers: &[Container<'_>],
    objects: &[Object],
) {
    let app_ports: Vec<(String, u16, Option<String>)> = containers
        .iter()
        .filter(|c| c.name != CONTAINER && (!c.init || c.sidecar))
        .flat_map(|c| {
            c.ports
                .iter()
                .map(|p| (c.name.clone(), p.number, p.name.clone()))
        })
        .collect();
    let policies = ingress_policies(objects, workload, &pod.labels);
    if policies.is_empty() {
        report.warn(
            workload,
            "no NetworkPolicy restricts ingress to its pods: any pod can reach the application on the pod IP, around sluice \
             (add one admitting only sluice's ports, or bind the application to 127.0.0.1)"
                .into(),
        );
        return;
    }
    for policy in policies {
        let policy_bypass = bypassed(policy);
        let Some(Value::Sequence(rules)) = at(&policy.value, &["spec", "ingress"]) else {
            continue; // no rule: nothing admitted
        };
        for rule in rules {
            let Some(Value::Sequence(ports)) = rule.get("ports") else {
                report.warn(
                    workload,
                    format!("{} admits every port, the application's too", policy.id()),
                );
                continue;
            };
            for port in ports {
                let Some(admitted) = port.get("port").and_then(scalar) else {
                    report.warn(
                        workload,
                        format!(
                            "{} admits every port of a protocol, the application's too",
                            policy.id()
                        ),
                    );
                    continue;
                };
                let admitted = Some(admitted);
                let meant = policy_bypass.iter().any(|b| Some(b) == admitted.as_ref());
                let hit = app_ports.iter().filter(|_| !meant).find(|(_, n, name)| {
                    admitted.as_deref() == Some(n.to_string().as_str())
                        || (admitted.is_some() && admitted == *name)
                });
                if let Some((container, n, _)) = hit {
                    report.warn(
                        workload,
                        format!(
                            "{} admits port {n} of container `{container}` directly",
                            policy.id()
                        ),
                    );
                }
            }
        }
    }
}
