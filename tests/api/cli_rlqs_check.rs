//! `sluice config check POLICIES --rlqs ENVOY_YAML` (issue 47): which policies each bucket of
//! Envoy's rate limit quota filter selects over RLQS, and a bucket that selects none refused
//! with the Envoy file's line. Run on docs/envoy.md's configuration to copy, taken from the page
//! as it is (so the page stays true), and on a broken copy of it.

use crate::cli::write;
use crate::helpers::{repo_root, run, sluice_command};

/// The first `yaml` block under "The Envoy configuration to copy" in docs/envoy.md.
fn block_to_copy() -> String {
    let page = std::fs::read_to_string(repo_root().join("docs/envoy.md")).expect("docs/envoy.md");
    let section = page
        .split_once("### The Envoy configuration to copy")
        .expect("the section")
        .1;
    section
        .split_once("```yaml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("a yaml block")
        .0
        .to_owned()
}

/// The 1-based line of the first `bucket_id_builder:` of `text`.
fn builder_line(text: &str) -> usize {
    text.lines()
        .position(|l| l.trim_start().starts_with("bucket_id_builder:"))
        .expect("a bucket_id_builder")
        + 1
}

#[test]
fn the_configuration_to_copy_selects_the_shipped_public_api() {
    let dir = tempfile::tempdir().expect("tempdir");
    let envoy = write(dir.path(), "envoy.yaml", &block_to_copy());
    let out = run(sluice_command(
        &repo_root(),
        &["config", "check", "config/policies.yaml", "--rlqs", &envoy],
    ));
    assert_eq!(out.code, Some(0), "{out:?}");
    // The bucket, on the line of its bucket_id_builder in the file.
    let line = builder_line(&block_to_copy());
    assert!(
        out.stdout.contains(&format!(
            "{envoy}:{line}: bucket {{tenant=<header x-tenant>, api_key=<header x-api-key>}} \
             (domain edge): policy public_api"
        )),
        "{out:?}"
    );
    assert!(out.stdout.contains("ok, 1 bucket(s)"), "{out:?}");
}

#[test]
fn a_bucket_that_selects_no_policy_is_refused_with_its_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The mistake the issue found: a fixed bucket name that is no policy's descriptors.
    let block = block_to_copy();
    let start = block
        .find("                bucket_id_builder:        #")
        .expect("the ids");
    let end = block
        .find("              reporting_interval")
        .expect("after the ids");
    let broken = format!(
        "{}                bucket_id_builder:\n                  bucket: {{ string_value: public_api }}\n{}",
        &block[..start],
        &block[end..]
    );
    let envoy = write(dir.path(), "envoy.yaml", &broken);
    let out = run(sluice_command(
        &repo_root(),
        &["config", "check", "config/policies.yaml", "--rlqs", &envoy],
    ));
    assert_eq!(out.code, Some(64), "{out:?}");
    let line = builder_line(&broken);
    assert!(
        out.stderr.contains(&format!(
            "{envoy}:{line}: bucket {{bucket=public_api}} (domain edge) matches no policy"
        )),
        "{out:?}"
    );
    // A file with no rate limit quota filter is refused too.
    let none = write(dir.path(), "none.yaml", "http_filters: []\n");
    let out = run(sluice_command(
        &repo_root(),
        &["config", "check", "config/policies.yaml", "--rlqs", &none],
    ));
    assert_eq!(out.code, Some(64), "{out:?}");
    assert!(out.stderr.contains("no rate limit quota filter"), "{out:?}");
}
