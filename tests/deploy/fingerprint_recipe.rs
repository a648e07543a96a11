//! docs/operations.md's recipe for a partition's fingerprint (`printf ... | openssl dgst ...`),
//! run as written with `sh` and the real `openssl`, gives what the daemon names the partition
//! (the `fingerprint` a reset answers) when both share `shadow.fingerprint_key`.

use axum::http::Method;
use sluice::client::{self, Target};

use crate::helpers::{
    json_of, repo_root, run_async, spawn_app_in, test_settings, SHIPPED_POLICIES,
};
use crate::tools::{self, example};

const KEY: &str = "3f9a1c0e5b7d2a4c6e8f0a1b2c3d4e5f";

/// Every command in backquotes on a line of docs/operations.md that runs `openssl dgst`.
fn recipes() -> Vec<String> {
    let doc = std::fs::read_to_string(repo_root().join("docs/operations.md")).expect("doc");
    doc.lines()
        .flat_map(|line| line.split('`').skip(1).step_by(2))
        .filter(|code| code.contains("openssl dgst"))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_fingerprint_recipe_gives_the_daemons_fingerprint() {
    if !tools::required("openssl") || !tools::required("sh") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = test_settings(dir.path());
    settings.shadow.fingerprint_key = Some(KEY.to_owned());
    let app = spawn_app_in(dir, settings, SHIPPED_POLICIES).await;
    let path = "/v1/counters?policy=login&d.ip=203.0.113.7";
    let reply = client::request(&Target::Tcp(app.admin), Method::DELETE, path, None)
        .await
        .expect("reset");
    let answer = json_of(&reply);
    let fingerprint = answer["fingerprint"].as_str().expect("a fingerprint");
    assert_eq!(fingerprint.len(), 16, "{answer}");
    let recipes = recipes();
    assert!(!recipes.is_empty(), "docs/operations.md gives the recipe");
    for recipe in recipes {
        // The doc's placeholder policy `P` is the login policy here.
        let command = recipe.replace("'%s\\0%s' P ", "'%s\\0%s' login ");
        assert!(command.contains(" login 203.0.113.7 "), "{recipe}");
        let mut sh = example("sh", &["-c", &command]);
        sh.env("KEY", KEY);
        let out = run_async(sh).await;
        assert_eq!(out.code, Some(0), "{recipe}: {out:?}");
        assert_eq!(out.stdout.trim(), fingerprint, "`{recipe}`: {out:?}");
    }
}
