//! One image name: every `…sluice:<version>` in the manifests, the docs, the Dockerfile and the
//! release workflow is `sluice inject`'s default (`IMAGE_REPOSITORY:<Cargo.toml version>`), so
//! the name in the docs is the name the tag pushes and the injector injects.

use std::path::{Path, PathBuf};

use sluice_k8s::inject::sidecar::{default_image, IMAGE_REPOSITORY};

use crate::helpers::{doc_files, repo_root};

/// Every `<registry/path/>sluice:<tag starting with a digit>` in `text`, with its line. A name
/// built from a shell variable (`$REGISTRY/sluice:…`) is the reader's own and is skipped.
fn image_refs(text: &str) -> Vec<(usize, String)> {
    let mut refs = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let mut from = 0;
        while let Some(at) = line[from..].find("sluice:") {
            let at = from + at;
            from = at + "sluice:".len();
            let tag: String = line[from..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || ".-_".contains(*c))
                .collect();
            if !tag.starts_with(|c: char| c.is_ascii_digit()) {
                continue;
            }
            let start = line[..at]
                .rfind(|c: char| c.is_whitespace() || "\"'=`(".contains(c))
                .map_or(0, |i| i + 1);
            let name = format!("{}{tag}", &line[start..from]);
            if !name.contains('$') {
                refs.push((number + 1, name));
            }
        }
    }
    refs
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
}

#[test]
fn every_named_image_is_the_default_and_the_release_workflow_pushes_it() {
    let root = repo_root();
    let expected = default_image();
    assert_eq!(
        expected,
        format!("{IMAGE_REPOSITORY}:{}", env!("CARGO_PKG_VERSION"))
    );
    assert!(
        IMAGE_REPOSITORY.split('/').count() == 3 && IMAGE_REPOSITORY.contains('.'),
        "registry-qualified: {IMAGE_REPOSITORY}"
    );
    let mut files = doc_files();
    files.push(root.join("Dockerfile"));
    yaml_files(&root.join("deploy"), &mut files);
    yaml_files(&root.join(".github"), &mut files);
    let mut found = Vec::new();
    let mut wrong = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read");
        for (line, name) in image_refs(&text) {
            let at = format!(
                "{}:{line}",
                file.strip_prefix(&root).unwrap_or(file).display()
            );
            if name == expected {
                found.push(at);
            } else {
                wrong.push(format!("{at}: {name}"));
            }
        }
    }
    assert!(wrong.is_empty(), "not {expected}:\n{}", wrong.join("\n"));
    for must in [
        "docs/kubernetes.md",
        "Dockerfile",
        "deploy/k8s/base/example-app.yaml",
        "deploy/k8s/injector/core/injector.yaml",
    ] {
        assert!(
            found.iter().any(|at| at.starts_with(&format!("{must}:"))),
            "{must} names no image: {found:?}"
        );
    }
    let workflow = std::fs::read_to_string(root.join(".github/workflows/release.yml"))
        .expect("the release workflow");
    assert!(
        workflow.contains(&format!("IMAGE: {IMAGE_REPOSITORY}\n")),
        "release.yml pushes {IMAGE_REPOSITORY}"
    );
}

#[test]
fn image_refs_are_found_with_their_registry() {
    let text = "image: ghcr.io/a/sluice:1.2.3\n- --image=sluice:0.1.0 x sluice:old \"$R/sluice:1\"";
    assert_eq!(
        image_refs(text),
        [
            (1, "ghcr.io/a/sluice:1.2.3".to_owned()),
            (2, "sluice:0.1.0".to_owned())
        ]
    );
}
