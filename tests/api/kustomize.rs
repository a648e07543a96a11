//! A small kustomize renderer for the subset `deploy/k8s` uses, so that the overlays are rendered
//! and validated where no kustomize binary exists: `resources` (files and directories with a
//! `kustomization.yaml`) and `patches` (strategic-merge patch files, matched by kind and name;
//! lists of objects merge by `name`, `volumeMounts` by `mountPath`, `ports` by `containerPort`).
//! Anything else in a kustomization fails loudly. Where `kubectl` is installed, a test compares
//! this renderer with `kubectl kustomize`.

use std::path::Path;

use serde::Deserialize;
use serde_yaml::{Mapping, Value};

/// Every document of a YAML file (empty documents dropped).
pub fn documents(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

/// Renders the kustomization in `dir`.
pub fn render(dir: &Path) -> Vec<Value> {
    let file = dir.join("kustomization.yaml");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let kustomization: Mapping = serde_yaml::from_str(&text).expect("kustomization is a mapping");
    for key in kustomization.keys() {
        let key = key.as_str().unwrap_or_default();
        assert!(
            ["apiVersion", "kind", "resources", "patches"].contains(&key),
            "{}: `{key}` is beyond this renderer's subset; extend tests/api/kustomize.rs \
             or render with kubectl kustomize",
            file.display()
        );
    }
    let mut objects = Vec::new();
    for resource in strings(&kustomization, "resources") {
        let path = dir.join(&resource);
        if path.is_dir() {
            objects.extend(render(&path));
        } else {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            objects.extend(documents(&text));
        }
    }
    let patches = kustomization
        .get("patches")
        .and_then(Value::as_sequence)
        .cloned()
        .unwrap_or_default();
    for patch in patches {
        let path = patch["path"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: only `patches: - path:` is supported", file.display()));
        let text = std::fs::read_to_string(dir.join(path)).expect("patch file");
        for patch in documents(&text) {
            let target = objects
                .iter_mut()
                .find(|o| same_object(o, &patch))
                .unwrap_or_else(|| {
                    panic!(
                        "patch {path}: no {:?} {:?} to patch",
                        patch["kind"], patch["metadata"]["name"]
                    )
                });
            merge(target, &patch, "");
        }
    }
    objects
}

fn strings(map: &Mapping, key: &str) -> Vec<String> {
    map.get(key)
        .and_then(Value::as_sequence)
        .map(|s| {
            s.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Same kind, name and namespace.
pub fn same_object(a: &Value, b: &Value) -> bool {
    a["kind"] == b["kind"]
        && a["metadata"]["name"] == b["metadata"]["name"]
        && a["metadata"]["namespace"] == b["metadata"]["namespace"]
}

/// Strategic merge of `patch` into `base`; `field` is the key `base` sits under.
pub fn merge(base: &mut Value, patch: &Value, field: &str) {
    match (base, patch) {
        (Value::Mapping(base), Value::Mapping(patch)) => {
            for (key, value) in patch {
                assert!(
                    key.as_str() != Some("$patch"),
                    "$patch directives are not supported"
                );
                if value.is_null() {
                    base.remove(key);
                    continue;
                }
                let name = key.as_str().unwrap_or_default();
                match base.get_mut(key) {
                    Some(existing) => merge(existing, value, name),
                    None => {
                        base.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (Value::Sequence(base), Value::Sequence(patch)) => {
            let merge_key = match field {
                "volumeMounts" => "mountPath",
                "ports" => "containerPort",
                _ => "name",
            };
            let keyed = |v: &Value| v.get(merge_key).is_some();
            if !(base.iter().all(keyed) && patch.iter().all(keyed)) {
                *base = patch.clone();
                return;
            }
            // Like kustomize: the patch's items first, in its order (merged into their base
            // item when there is one), then the base's other items in their order.
            let mut merged = Vec::with_capacity(base.len() + patch.len());
            for item in patch {
                let mut item = item.clone();
                if let Some(at) = base
                    .iter()
                    .position(|b| b.get(merge_key) == item.get(merge_key))
                {
                    let mut existing = base.remove(at);
                    merge(&mut existing, &item, "");
                    item = existing;
                }
                merged.push(item);
            }
            merged.append(base);
            *base = merged;
        }
        (base, patch) => *base = patch.clone(),
    }
}

#[test]
fn strategic_merge_merges_named_lists_and_replaces_the_rest() {
    let mut base: Value = serde_yaml::from_str(
        "spec:\n  replicas: 1\n  args: [a, b]\n  containers:\n    - {name: x, image: x:1, env: [{name: A, value: '1'}, {name: B, value: '2'}]}\n    - {name: y, image: y:1}\n  drop: me\n",
    )
    .expect("fixture");
    let patch: Value = serde_yaml::from_str(
        "spec:\n  replicas: 3\n  args: [c]\n  containers:\n    - {name: x, env: [{name: B, value: '9'}, {name: C, value: '3'}]}\n  drop: null\n",
    )
    .expect("fixture");
    merge(&mut base, &patch, "");
    let want: Value = serde_yaml::from_str(
        "spec:\n  replicas: 3\n  args: [c]\n  containers:\n    - {name: x, image: x:1, env: [{name: B, value: '9'}, {name: C, value: '3'}, {name: A, value: '1'}]}\n    - {name: y, image: y:1}\n",
    )
    .expect("fixture");
    assert_eq!(base, want);
}
