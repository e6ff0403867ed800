//! Ingress objects out of multi-document YAML: `kind: Ingress` of
//! `networking.k8s.io/v1`, also inside a `kind: List`. Other objects are
//! named in a comment of the output and otherwise left alone.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde_yaml::Value;

/// The annotations this importer reads all begin with this.
pub const ANNOTATION_PREFIX: &str = "nginx.ingress.kubernetes.io/";

/// A document that is not YAML, or not an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// `FILE, document N`.
    pub origin: String,
    pub message: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.origin, self.message)
    }
}

impl std::error::Error for LoadError {}

/// What one file held.
#[derive(Debug, Default)]
pub struct Found {
    pub ingresses: Vec<Ingress>,
    /// `Kind namespace/name (origin)` of the objects that are no Ingress
    /// this importer reads.
    pub skipped: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ingress {
    #[serde(default)]
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: Spec,
    /// Where it was read: `FILE, document N`.
    #[serde(skip)]
    pub origin: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Metadata {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    /// Values as written; a number or boolean written unquoted is kept
    /// as its text.
    #[serde(default)]
    pub annotations: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    #[serde(default)]
    pub default_backend: Option<Backend>,
    #[serde(default)]
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Rule {
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default)]
    pub http: Option<Http>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Http {
    #[serde(default)]
    pub paths: Vec<HttpPath>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpPath {
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub path_type: Option<String>,
    #[serde(default)]
    pub backend: Backend,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Backend {
    #[serde(default)]
    pub service: Option<Service>,
    #[serde(default)]
    pub resource: Option<Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Service {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub port: Option<Port>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Port {
    #[serde(default)]
    pub number: Option<u32>,
    #[serde(default)]
    pub name: Option<String>,
}

impl Ingress {
    /// `namespace/name`, or `name` without a namespace.
    pub fn id(&self) -> String {
        match &self.metadata.namespace {
            Some(ns) => format!("{ns}/{}", self.metadata.name),
            None => self.metadata.name.clone(),
        }
    }

    /// The annotation `nginx.ingress.kubernetes.io/<name>`, as text.
    pub fn annotation(&self, name: &str) -> Option<String> {
        let value = self
            .metadata
            .annotations
            .get(&format!("{ANNOTATION_PREFIX}{name}"))?;
        text(value)
    }
}

impl Backend {
    /// `service NAME:PORT`, for a comment.
    pub fn describe(&self) -> String {
        match (&self.service, &self.resource) {
            (Some(service), _) => {
                let port = service
                    .port
                    .as_ref()
                    .and_then(|p| p.number.map(|n| n.to_string()).or_else(|| p.name.clone()));
                match port {
                    Some(port) => format!("service {}:{port}", service.name),
                    None => format!("service {}", service.name),
                }
            }
            (None, Some(_)) => "a resource backend".to_owned(),
            (None, None) => "no backend".to_owned(),
        }
    }
}

/// A scalar as text.
pub fn text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Every object of `text` (the file `file`).
pub fn load(file: &str, text: &str) -> Result<Found, LoadError> {
    let mut found = Found::default();
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let origin = format!("{file}, document {}", index + 1);
        let value = Value::deserialize(document).map_err(|error| LoadError {
            origin: origin.clone(),
            message: error.to_string(),
        })?;
        collect(value, &origin, &mut found)?;
    }
    Ok(found)
}

fn collect(value: Value, origin: &str, found: &mut Found) -> Result<(), LoadError> {
    let error = |message: &str| LoadError {
        origin: origin.to_owned(),
        message: message.to_owned(),
    };
    let map = match value {
        Value::Null => return Ok(()),
        Value::Mapping(map) => map,
        _ => return Err(error("not a Kubernetes object (a mapping with kind)")),
    };
    let field = |key: &str| map.get(key).and_then(text).unwrap_or_default();
    let (kind, api) = (field("kind"), field("apiVersion"));
    if kind.ends_with("List") {
        if let Some(Value::Sequence(items)) = map.get("items") {
            for (i, item) in items.iter().enumerate() {
                collect(item.clone(), &format!("{origin}, item {}", i + 1), found)?;
            }
        }
        return Ok(());
    }
    if kind.is_empty() {
        return Err(error("no kind: not a Kubernetes object"));
    }
    let name = map
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(text)
        .unwrap_or_default();
    if kind != "Ingress" || api != "networking.k8s.io/v1" {
        let why = if kind == "Ingress" {
            format!(" (apiVersion {api}: only networking.k8s.io/v1 is read)")
        } else {
            String::new()
        };
        found.skipped.push(format!("{kind} {name}{why} ({origin})"));
        return Ok(());
    }
    let mut ingress: Ingress = serde_yaml::from_value(Value::Mapping(map))
        .map_err(|e| error(&format!("an Ingress that does not read as one: {e}")))?;
    ingress.origin = origin.to_owned();
    found.ingresses.push(ingress);
    Ok(())
}
