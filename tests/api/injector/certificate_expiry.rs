//! `sluice_injector_certificate_expiry_seconds`: seconds until the served certificate's
//! notAfter, from certificates made by the real `sluice injector certs`, and updated when a
//! renewed certificate is re-read.

use std::path::Path;

use sluice_k8s::inject::Options;

use crate::helpers::{metric_value, repo_root, run_async, sluice_command};
use crate::injector_support::TestInjector;

const METRIC: &str = "sluice_injector_certificate_expiry_seconds";
const DAY: f64 = 86_400.0;

/// `sluice injector certs --days DAYS --out DIR`.
async fn certs(dir: &Path, days: u32) {
    let (out, days) = (dir.to_str().expect("utf-8"), days.to_string());
    let args = ["injector", "certs", "--days", days.as_str(), "--out", out];
    let outcome = run_async(sluice_command(&repo_root(), &args)).await;
    assert_eq!(outcome.code, Some(0), "{outcome:?}");
}

/// The metric now, which must be exported.
async fn expiry(injector: &TestInjector) -> f64 {
    let metrics = injector.metrics().await;
    assert!(
        metrics.contains(&format!("\n{METRIC} ")),
        "{METRIC} missing:\n{metrics}"
    );
    metric_value(&metrics, METRIC, &[])
}

#[tokio::test]
async fn the_injector_exports_seconds_until_its_certificate_expires() {
    let (served, renewed) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    certs(served.path(), 365).await;
    certs(renewed.path(), 10).await;
    let injector = TestInjector::start(served.path(), Options::default()).await;
    let first = expiry(&injector).await;
    // rcgen's not_after is whole seconds from now at issue; allow the test's own run time.
    assert!(
        (365.0 * DAY - 600.0..=365.0 * DAY).contains(&first),
        "a 365-day certificate: {first} s"
    );

    // Renewed (here: a shorter one, to tell them apart): both files replaced by renames.
    for file in ["tls.key", "tls.crt"] {
        let staged = served.path().join(format!(".{file}.new"));
        std::fs::copy(renewed.path().join(file), &staged).expect("copy");
        std::fs::rename(&staged, served.path().join(file)).expect("rename");
    }
    let now = crate::wait::until(
        "the renewed certificate's expiry is exported",
        crate::wait::WAIT,
        || async {
            let now = expiry(&injector).await;
            match now > 11.0 * DAY {
                false => Ok(now),
                true => Err(format!("{now} s")),
            }
        },
    )
    .await;
    assert!(
        (10.0 * DAY - 600.0..=10.0 * DAY).contains(&now),
        "a 10-day certificate: {now} s"
    );
    injector.stop().await;
}
