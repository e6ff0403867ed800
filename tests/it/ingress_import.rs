//! `sluice import ingress-nginx` through the binary: the fixtures import
//! into a configuration `sluice check` passes, and a sidecar running an
//! imported configuration holds the Ingress's rate as ingress-nginx did
//! (`limit-rpm: 6` with `limit-burst-multiplier: 1` is nginx's
//! `burst=6 nodelay`: 7 requests at once, the 8th refused).

use std::path::Path;

use http::StatusCode;

use crate::support::sidecar::{run_binary, write_config};
use crate::support::{get, Sidecar, Upstream};

const INGRESS: &str = "apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: api
  namespace: shop
  annotations:
    nginx.ingress.kubernetes.io/limit-rpm: \"6\"
    nginx.ingress.kubernetes.io/limit-burst-multiplier: \"1\"
    nginx.ingress.kubernetes.io/limit-rate: \"100\"
spec:
  rules:
    - host: api.shop.example
      http:
        paths:
          - path: /api
            pathType: Prefix
            backend:
              service: { name: api, port: { number: 8080 } }
";

fn import(files: &[&Path]) -> String {
    let mut args = vec!["import", "ingress-nginx"];
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    let (code, out, err) = run_binary(&args, &[]);
    assert_eq!(code, 0, "{err}");
    out
}

fn check_passes(yaml: &str) -> String {
    let (_dir, path) = write_config(yaml);
    let (code, out, err) = run_binary(&["check", "--config", path.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "sluice check refused the import:\n{err}\n{yaml}");
    out
}

#[test]
fn the_fixtures_import_into_a_configuration_sluice_check_passes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ingress-nginx");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let paths: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
    let yaml = import(&paths);
    let table = check_passes(&yaml);
    assert!(table.contains("gcra 10/1s burst 51"), "{table}");
    assert!(table.contains("concurrency 20 in flight"), "{table}");
    for annotation in ["limit-rate", "limit-rate-after", "global-rate-limit"] {
        let said =
            format!("# sluice import: not carried over: nginx.ingress.kubernetes.io/{annotation}:");
        assert!(yaml.contains(&said), "{said}\n{yaml}");
    }
}

#[test]
fn a_file_that_is_not_yaml_is_refused_by_name() {
    let (dir, _) = write_config("");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "kind: Ingress\nspec: [\n").unwrap();
    let (code, _, err) = run_binary(&["import", "ingress-nginx", bad.to_str().unwrap()], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("bad.yaml, document 1"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_rate_holds_in_front_of_the_app() {
    let (dir, _) = write_config("");
    let ingress = dir.path().join("api.yaml");
    std::fs::write(&ingress, INGRESS).unwrap();
    let yaml = import(&[&ingress]);
    check_passes(&yaml);

    let upstream = Upstream::start().await;
    let yaml = yaml
        .replace("listen: 0.0.0.0:8080", "listen: 127.0.0.1:0")
        .replace("admin: 0.0.0.0:9901", "admin: 127.0.0.1:0")
        .replace(
            "url: http://127.0.0.1:3000",
            &format!("url: {}", upstream.url()),
        );
    let sluice = Sidecar::start(&yaml);
    let host = [("host", "api.shop.example")];
    for i in 0..7 {
        let (status, _, _) = get(sluice.addr(), "/api/orders", &host).await;
        assert_eq!(status, StatusCode::OK, "request {}", i + 1);
    }
    let (status, headers, _) = get(sluice.addr(), "/api/orders", &host).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(headers.contains_key("retry-after"));
    assert_eq!(upstream.count(), 7);
    // Outside the Ingress's paths, or for another host, nothing is limited.
    for _ in 0..10 {
        assert_eq!(get(sluice.addr(), "/other", &host).await.0, StatusCode::OK);
        let other_host = [("host", "www.shop.example")];
        assert_eq!(
            get(sluice.addr(), "/api/orders", &other_host).await.0,
            StatusCode::OK
        );
    }
}
