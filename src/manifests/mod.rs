//! `sluice check-manifests`: what a rendering (`helm template`, `kubectl
//! kustomize`, the manifests about to be applied) must hold for every
//! request to reach sluice before the application. The chart and the
//! Kustomize component only ever add sluice; whether it ended up where it
//! was meant to, and whether some Service still reaches the application
//! directly, can only be seen in the result, so this reads the result.
//!
//! Errors (the rendering is refused):
//!
//! - a workload labelled `sluice/sidecar: enabled` (on itself or its pod
//!   template) runs no `sluice` container: the label came after the
//!   component ran (an overlay's `labels:`), or the patch missed it;
//! - a `sluice` init container without `restartPolicy: Always` (the pod
//!   would never start), or one not declaring its traffic port `sluice`;
//! - sluice's mounted configuration (when the input holds its ConfigMap)
//!   listening elsewhere than the ports the container declares, or
//!   forwarding to one of them;
//! - a Service selecting a pod that runs sluice has a port reaching another
//!   container (or no declared port at all) — unless the Service names that
//!   port in its `sluice/bypass-ports` annotation — or a port naming no
//!   port of the pod;
//! - a Service labelled `sluice/sidecar: enabled` selects no pod running
//!   sluice;
//! - nothing in the input runs sluice.
//!
//! Warnings (reported, not refused): a pod running sluice that no
//! NetworkPolicy restricts, or whose policies admit a port of the
//! application (one the policy's `sluice/bypass-ports` does not name):
//! other pods can reach the application on the pod IP.

mod mounted;
mod objects;
mod rules;
#[cfg(test)]
mod tests;

pub use objects::{load, LoadError, Object};
pub use rules::{check, Finding, Report, Severity};

/// The label the Kustomize component's patches select, and that marks a
/// workload or Service meant to have sluice.
pub const SIDECAR_LABEL: &str = "sluice/sidecar";

/// A Service's (or NetworkPolicy's) annotation naming the ports (by name
/// or number, comma separated) that reach the application directly on
/// purpose, e.g. its metrics port.
pub const BYPASS_ANNOTATION: &str = "sluice/bypass-ports";

/// The name of sluice's container, and of its two ports.
pub const CONTAINER: &str = "sluice";
pub const TRAFFIC_PORT: &str = "sluice";
pub const METRICS_PORT: &str = "sluice-metrics";
