//! Rendered Kubernetes manifests as `sluice check-manifests` reads them:
//! multi-document YAML (what `helm template` and `kubectl kustomize`
//! print), `kind: List` expanded, and from each workload the pod it runs.

use std::fmt;

use serde::Deserialize as _;
use serde_yaml::{Mapping, Value};

/// One object of the input, with where it came from.
#[derive(Debug, Clone)]
pub struct Object {
    pub kind: String,
    pub name: String,
    pub namespace: Option<String>,
    pub labels: Mapping,
    pub annotations: Mapping,
    pub value: Value,
    /// `FILE, document N` (1-based), for messages.
    pub origin: String,
}

impl Object {
    /// `Kind/name`, as kubectl names an object.
    pub fn id(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }

    /// Whether two objects can meet: the same namespace, or one without any
    /// (it gets one when applied).
    pub fn shares_namespace(&self, other: &Object) -> bool {
        match (&self.namespace, &other.namespace) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        }
    }

    pub fn label(&self, key: &str) -> Option<String> {
        self.labels.get(key).and_then(scalar)
    }

    pub fn annotation(&self, key: &str) -> Option<String> {
        self.annotations.get(key).and_then(scalar)
    }
}

/// A document that is not a Kubernetes object, or YAML that does not parse.
#[derive(Debug)]
pub struct LoadError {
    pub origin: String,
    pub message: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.origin, self.message)
    }
}

/// Every object in `text` (the contents of `file`). Empty documents (a
/// template that rendered nothing, comments only) are skipped.
pub fn load(file: &str, text: &str) -> Result<Vec<Object>, LoadError> {
    let mut objects = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let origin = format!("{file}, document {}", index + 1);
        let value = Value::deserialize(document).map_err(|error| LoadError {
            origin: origin.clone(),
            message: error.to_string(),
        })?;
        collect(value, &origin, &mut objects)?;
    }
    Ok(objects)
}

fn collect(value: Value, origin: &str, objects: &mut Vec<Object>) -> Result<(), LoadError> {
    let Value::Mapping(map) = value else {
        return match value {
            Value::Null => Ok(()),
            _ => Err(LoadError {
                origin: origin.to_owned(),
                message: "not a Kubernetes object (a mapping with kind and metadata)".into(),
            }),
        };
    };
    let kind = map.get("kind").and_then(scalar).unwrap_or_default();
    if kind == "List" || kind.ends_with("List") && map.contains_key("items") {
        if let Some(Value::Sequence(items)) = map.get("items") {
            for (i, item) in items.iter().enumerate() {
                collect(item.clone(), &format!("{origin}, item {}", i + 1), objects)?;
            }
        }
        return Ok(());
    }
    if kind.is_empty() {
        return Err(LoadError {
            origin: origin.to_owned(),
            message: "no kind: not a Kubernetes object".into(),
        });
    }
    let metadata = map.get("metadata").and_then(Value::as_mapping);
    let field = |key: &str| metadata.and_then(|m| m.get(key));
    objects.push(Object {
        kind,
        name: field("name").and_then(scalar).unwrap_or_default(),
        namespace: field("namespace").and_then(scalar),
        labels: field("labels")
            .and_then(Value::as_mapping)
            .cloned()
            .unwrap_or_default(),
        annotations: field("annotations")
            .and_then(Value::as_mapping)
            .cloned()
            .unwrap_or_default(),
        value: Value::Mapping(map),
        origin: origin.to_owned(),
    });
    Ok(())
}

/// A scalar as text (labels and ports may be written unquoted: `true`, 80).
pub fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// `value` at `path` (mapping keys), if every step is there.
pub fn at<'v>(value: &'v Value, path: &[&str]) -> Option<&'v Value> {
    path.iter().try_fold(value, |v, key| v.get(key))
}

/// The pod a workload runs: its labels, annotations and spec.
#[derive(Debug)]
pub struct Pod<'o> {
    pub labels: Mapping,
    pub spec: &'o Value,
}

/// The pod template of a workload kind sluice can run in; `None` for any
/// other object.
pub fn pod(object: &Object) -> Option<Pod<'_>> {
    let template = match object.kind.as_str() {
        "Pod" => &object.value,
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "ReplicationController"
        | "Job" => at(&object.value, &["spec", "template"])?,
        "CronJob" => at(&object.value, &["spec", "jobTemplate", "spec", "template"])?,
        _ => return None,
    };
    Some(Pod {
        labels: at(template, &["metadata", "labels"])
            .and_then(Value::as_mapping)
            .cloned()
            .unwrap_or_default(),
        spec: template.get("spec")?,
    })
}

/// A container of a pod, regular or init.
#[derive(Debug)]
pub struct Container<'p> {
    pub name: String,
    pub init: bool,
    /// An init container with `restartPolicy: Always`: a native sidecar,
    /// running beside the regular containers.
    pub sidecar: bool,
    pub ports: Vec<Port>,
    pub value: &'p Value,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    pub name: Option<String>,
    pub number: u16,
    pub protocol: String,
}

impl Pod<'_> {
    pub fn containers(&self) -> Vec<Container<'_>> {
        let mut found = Vec::new();
        for (key, init) in [("initContainers", true), ("containers", false)] {
            let Some(Value::Sequence(list)) = self.spec.get(key) else {
                continue;
            };
            for value in list {
                let sidecar = init
                    && value.get("restartPolicy").and_then(scalar).as_deref() == Some("Always");
                found.push(Container {
                    name: value.get("name").and_then(scalar).unwrap_or_default(),
                    init,
                    sidecar,
                    ports: ports(value),
                    value,
                });
            }
        }
        found
    }
}

fn ports(container: &Value) -> Vec<Port> {
    let Some(Value::Sequence(list)) = container.get("ports") else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|p| {
            let number = p.get("containerPort")?.as_u64()?;
            Some(Port {
                name: p.get("name").and_then(scalar),
                number: u16::try_from(number).ok()?,
                protocol: protocol(p),
            })
        })
        .collect()
}

/// A port's protocol, TCP when left out (as the API server defaults it).
pub fn protocol(port: &Value) -> String {
    port.get("protocol")
        .and_then(scalar)
        .unwrap_or_else(|| "TCP".into())
}

/// Whether every `key: value` of `selector` is among `labels`; an empty
/// selector selects nothing here (a Service without one has its endpoints
/// written by hand).
pub fn selects(selector: &Mapping, labels: &Mapping) -> bool {
    !selector.is_empty()
        && selector.iter().all(|(key, want)| {
            labels
                .get(key)
                .and_then(scalar)
                .is_some_and(|have| Some(have) == scalar(want))
        })
}
