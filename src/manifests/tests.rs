use super::*;

fn report(name: &str, text: &str) -> Report {
    check(&load(name, text).expect("fixture loads"))
}

fn errors(report: &Report) -> Vec<String> {
    report
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .map(|f| format!("{}: {}", f.object, f.message))
        .collect()
}

const ADDED: &str = include_str!("../../tests/fixtures/manifests/sidecar_added.yaml");
const OVERLAY_LABEL: &str = include_str!("../../tests/fixtures/manifests/label_from_overlay.yaml");
const METRICS_FIRST: &str = include_str!("../../tests/fixtures/manifests/metrics_port_first.yaml");
const BLOCKING_INIT: &str =
    include_str!("../../tests/fixtures/manifests/sluice_as_blocking_init.yaml");

#[test]
fn sidecar_in_front_of_every_port_passes() {
    let r = report("added.yaml", ADDED);
    assert_eq!(errors(&r), Vec::<String>::new());
    assert_eq!(r.warnings(), 0, "{r}");
    let text = r.to_string();
    assert!(
        text.contains("Service/shop: port http (80) reaches sluice in Deployment/shop"),
        "{text}"
    );
    assert!(
        text.contains("port metrics (9100) reaches container `shop` port 9100"),
        "{text}"
    );
    assert!(
        text.contains("Deployment/shop: sluice (native sidecar) on 8080, metrics on 9901"),
        "{text}"
    );
}

#[test]
fn bypass_needs_the_annotation() {
    let without = ADDED.replace("sluice/bypass-ports: metrics", "other: x");
    let errors = errors(&report("added.yaml", &without));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].starts_with("Service/shop (added.yaml, document 1): port metrics (9100) reaches container `shop` on port 9100"));
    // By number as well as by name.
    let by_number = ADDED.replace(
        "sluice/bypass-ports: metrics",
        "sluice/bypass-ports: \"9100, 443\"",
    );
    assert_eq!(
        self::errors(&report("added.yaml", &by_number)),
        Vec::<String>::new()
    );
}

#[test]
fn a_label_added_after_the_patch_is_refused() {
    let r = report("overlay.yaml", OVERLAY_LABEL);
    let errors = errors(&r);
    assert!(
        errors.iter().any(|e| e.starts_with("Deployment/billing (overlay.yaml, document 3): labelled sluice/sidecar: enabled but runs no `sluice` container")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.starts_with("Service/billing")
            && e.contains("selects Deployment/billing, which runs no sluice")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("input: no workload runs")),
        "{errors:?}"
    );
    assert_eq!(errors.len(), 3, "{errors:?}");
}

#[test]
fn a_port_patched_by_position_is_found() {
    let r = report("first.yaml", METRICS_FIRST);
    let errors = errors(&r);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].starts_with("Service/billing (first.yaml, document 1, item 1): port http (80) reaches container `billing` on port 8000"), "{errors:?}");
    // The metrics port landed on sluice's traffic port: no bypass, but not
    // what was meant either; the table says so.
    assert!(r
        .to_string()
        .contains("port metrics (9100) reaches sluice in Deployment/billing"));
    // No NetworkPolicy: a warning, not a refusal.
    assert_eq!(r.warnings(), 1);
}

#[test]
fn a_blocking_init_container_and_old_port_names_are_refused() {
    let errors = errors(&report("init.yaml", BLOCKING_INIT));
    let expected = [
        "Pod/api (init.yaml, document 1): `sluice` is an init container without restartPolicy: Always",
        "Pod/api (init.yaml, document 1): `sluice` declares no port named `sluice`",
        "Service/api (init.yaml, document 2): port 80 reaches port 3000, which no container declares,",
        "Service/api (init.yaml, document 2): port grpc (81) targets `grpc`, which no container of Pod/api names",
    ];
    assert_eq!(errors.len(), expected.len(), "{errors:?}");
    for (error, start) in errors.iter().zip(expected) {
        assert!(
            error.starts_with(start),
            "{error}\n  does not start with\n{start}"
        );
    }
}

#[test]
fn named_ports_resolve_as_the_endpoints_controller_does() {
    // A name only a plain init container declares resolves to nothing; the
    // protocol must match too.
    let text = ADDED
        .replace("targetPort: sluice }", "targetPort: sluice, protocol: UDP }")
        .replace("- name: migrate\n          image: shop", "- name: migrate\n          image: shop\n          ports: [{ name: debug, containerPort: 6060 }]");
    let errors = errors(&report("added.yaml", &text));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("port http (80) targets `sluice`, which no container"),
        "{errors:?}"
    );
}

#[test]
fn numeric_strings_and_colliding_ports_are_refused() {
    let text = ADDED
        .replace("targetPort: sluice }", "targetPort: \"8080\" }")
        .replace(
            "{ name: web, containerPort: 3000 }",
            "{ name: sluice, containerPort: 9901 }",
        );
    let errors = errors(&report("added.yaml", &text));
    assert!(
        errors
            .iter()
            .any(|e| e.contains("port http (80) has targetPort \"8080\"")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("container `shop` declares port 9901, which is sluice's")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("container `shop` names a port `sluice`")),
        "{errors:?}"
    );
}

#[test]
fn network_policies_that_admit_the_application_are_reported() {
    let open = ADDED.replace(
        "- ports: [{ port: sluice-metrics, protocol: TCP }]",
        "- ports: [{ port: 9100 }]\n    - from: []",
    );
    let r = report("added.yaml", &open);
    let warnings: Vec<&str> = r.findings.iter().map(|f| f.message.as_str()).collect();
    assert!(
        warnings.contains(
            &"NetworkPolicy/sluice-sidecar admits port 9100 of container `shop` directly"
        ),
        "{warnings:?}"
    );
    assert!(
        warnings.contains(&"NetworkPolicy/sluice-sidecar admits every port, the application's too"),
        "{warnings:?}"
    );
    assert_eq!(r.errors(), 0);
    // Named in the policy's annotation: meant, no warning for that port.
    let meant = open.replace(
        "name: sluice-sidecar\n",
        "name: sluice-sidecar\n  annotations: { sluice/bypass-ports: \"9100\" }\n",
    );
    let r = report("added.yaml", &meant);
    let warnings: Vec<&str> = r.findings.iter().map(|f| f.message.as_str()).collect();
    assert_eq!(
        warnings,
        ["NetworkPolicy/sluice-sidecar admits every port, the application's too"]
    );
}

#[test]
fn namespaces_keep_services_apart() {
    let other = METRICS_FIRST
        .replace(
            "name: billing\n      labels",
            "name: billing\n      namespace: a\n      labels",
        )
        .replace(
            "      name: billing\n    spec:\n      selector: { matchLabels",
            "      name: billing\n      namespace: b\n    spec:\n      selector: { matchLabels",
        );
    let errors = errors(&report("ns.yaml", &other));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("selects no pod in the input"),
        "{errors:?}"
    );
}

#[test]
fn what_is_not_an_object_is_a_load_error() {
    let error = load("x.yaml", "kind: Service\n---\n- a\n").unwrap_err();
    assert_eq!(error.origin, "x.yaml, document 2");
    let error = load("x.yaml", "a: [").unwrap_err();
    assert!(error.message.contains("line"), "{error}");
    assert!(load("x.yaml", "---\n# nothing\n---\n").unwrap().is_empty());
}

#[test]
fn the_mounted_configuration_listens_on_the_declared_ports() {
    let moved = ADDED
        .replace("listen: 0.0.0.0:8080", "listen: 0.0.0.0:8081")
        .replace("url: http://127.0.0.1:3000", "url: http://127.0.0.1:9901");
    let errors = errors(&report("added.yaml", &moved));
    assert_eq!(
        errors,
        [
            "Deployment/shop (added.yaml, document 2): sluice's server.listen in ConfigMap/sluice-config is port 8081, but its container port `sluice` is 8080",
            "Deployment/shop (added.yaml, document 2): sluice's upstream.url in ConfigMap/sluice-config is its own port 9901: it would forward to itself",
        ]
    );
    // A subPath mount and items naming the file are followed too.
    let sub = moved
        .replace(
            "mountPath: /etc/sluice, readOnly: true",
            "mountPath: /etc/sluice/sluice.yaml, subPath: conf.yaml",
        )
        .replace(
            "configMap: { name: sluice-config }",
            "configMap: { name: sluice-config, items: [{ key: sluice.yaml, path: conf.yaml }] }",
        );
    assert_eq!(self::errors(&report("added.yaml", &sub)).len(), 2);
    // Without the ConfigMap in the input there is nothing to compare.
    let alone = moved
        .split("\n---\napiVersion: v1\nkind: ConfigMap")
        .next()
        .unwrap()
        .to_owned();
    assert_eq!(
        self::errors(&report("added.yaml", &alone)),
        Vec::<String>::new()
    );
}
