//! The Kubernetes tools: [`inject`] adds the sluice native sidecar to Kubernetes YAML
//! (`sluice inject`), [`injector`] is the mutating admission webhook that does it for opted-in pods
//! (`sluice injector`). They use the daemon's library (`sluice`) for settings, the listener loop and
//! logging; nothing in the daemon uses them.

pub mod inject;
pub mod injector;
