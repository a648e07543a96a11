//! The Kubernetes tools: `sluice inject` on manifests, and the admission webhook (`sluice injector`)
//! with its certificates and hostile requests.

mod certificate_expiry;
mod hardening;
mod inject;
mod webhook;
