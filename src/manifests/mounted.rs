//! sluice's configuration as its pod mounts it: the ConfigMap behind the
//! sluice container's `--config` path, when the input holds it. The ports
//! the manifests declare and target are worth checking only if they are
//! the ones sluice listens on.

use serde_yaml::Value;

use super::objects::{at, scalar, Container, Object, Pod};

/// Where the image's default command reads its configuration.
const DEFAULT_PATH: &str = "/etc/sluice/sluice.yaml";

/// The ports of a mounted configuration.
#[derive(Debug)]
pub struct Mounted {
    /// `ConfigMap/name`, for messages.
    pub source: String,
    pub listen: Option<u16>,
    pub admin: Option<u16>,
    pub upstream: Option<u16>,
}

/// The configuration file path the container's arguments name.
fn config_path(sluice: &Container<'_>) -> String {
    let args: Vec<String> = match sluice.value.get("args") {
        Some(Value::Sequence(list)) => list.iter().filter_map(scalar).collect(),
        _ => Vec::new(),
    };
    let mut words = args.iter();
    while let Some(word) = words.next() {
        if let Some(path) = word.strip_prefix("--config=") {
            return path.to_owned();
        }
        if word == "--config" {
            if let Some(path) = words.next() {
                return path.clone();
            }
        }
    }
    DEFAULT_PATH.to_owned()
}

/// The ConfigMap key mounted at `path`: (volume name, key).
fn mounted_key(sluice: &Container<'_>, path: &str) -> Option<(String, String)> {
    let Some(Value::Sequence(mounts)) = sluice.value.get("volumeMounts") else {
        return None;
    };
    mounts.iter().find_map(|mount| {
        let name = mount.get("name").and_then(scalar)?;
        let at_path = mount.get("mountPath").and_then(scalar)?;
        match mount.get("subPath").and_then(scalar) {
            Some(sub) if at_path == path => Some((name, sub)),
            Some(_) => None,
            None => {
                let file = path.strip_prefix(&at_path)?.strip_prefix('/')?;
                (!file.contains('/')).then(|| (name, file.to_owned()))
            }
        }
    })
}

/// The ConfigMap volume `volume` of the pod: (ConfigMap name, the key that
/// appears as `file`).
fn config_map_key(pod: &Pod<'_>, volume: &str, file: &str) -> Option<(String, String)> {
    let Some(Value::Sequence(volumes)) = pod.spec.get("volumes") else {
        return None;
    };
    let source = volumes
        .iter()
        .find(|v| v.get("name").and_then(scalar).as_deref() == Some(volume))?
        .get("configMap")?;
    let name = source.get("name").and_then(scalar)?;
    let key = match source.get("items") {
        Some(Value::Sequence(items)) => items.iter().find_map(|item| {
            (item.get("path").and_then(scalar).as_deref() == Some(file))
                .then(|| item.get("key").and_then(scalar))
                .flatten()
        })?,
        _ => file.to_owned(),
    };
    Some((name, key))
}

fn port_of(address: &str) -> Option<u16> {
    address
        .rsplit_once(':')?
        .1
        .trim_end_matches('/')
        .parse()
        .ok()
}

/// The port of a URL: explicit, or the scheme's.
fn url_port(url: &str) -> Option<u16> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split('/').next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let port = match host_port.strip_prefix('[') {
        Some(bracketed) => bracketed.split_once("]:").map(|(_, p)| p),
        None => host_port.rsplit_once(':').map(|(_, p)| p),
    };
    match port {
        Some(port) => port.parse().ok(),
        None if scheme == "https" => Some(443),
        None => Some(80),
    }
}

/// sluice's mounted configuration, if the input holds its ConfigMap and
/// the file parses (a file sluice would refuse is `sluice check`'s to
/// report).
pub fn mounted(
    sluice: &Container<'_>,
    pod: &Pod<'_>,
    workload: &Object,
    objects: &[Object],
) -> Option<Mounted> {
    let path = config_path(sluice);
    let (volume, file) = mounted_key(sluice, &path)?;
    let (name, key) = config_map_key(pod, &volume, &file)?;
    let config_map = objects
        .iter()
        .find(|o| o.kind == "ConfigMap" && o.name == name && o.shares_namespace(workload))?;
    let text = at(&config_map.value, &["data", &key]).and_then(Value::as_str)?;
    let config: Value = serde_yaml::from_str(text).ok()?;
    let field = |path: &[&str]| at(&config, path).and_then(scalar);
    Some(Mounted {
        source: config_map.id(),
        listen: field(&["server", "listen"]).as_deref().and_then(port_of),
        admin: field(&["server", "admin"]).as_deref().and_then(port_of),
        upstream: field(&["upstream", "url"]).as_deref().and_then(url_port),
    })
}

#[cfg(test)]
mod tests {
    use super::{port_of, url_port};

    #[test]
    fn ports_of_addresses_and_urls() {
        assert_eq!(port_of("0.0.0.0:8080"), Some(8080));
        assert_eq!(port_of("[::]:9901"), Some(9901));
        assert_eq!(url_port("http://127.0.0.1:3000"), Some(3000));
        assert_eq!(url_port("http://[::1]:3000/base"), Some(3000));
        assert_eq!(url_port("http://[::1]/base"), Some(80));
        assert_eq!(url_port("https://app.internal"), Some(443));
        assert_eq!(url_port("http://user:pw@app:81"), Some(81));
    }
}
