//! The JSONPatch (RFC 6902) that turns the pod the API server sent into the injected pod. Computed
//! as a difference between the two, so that the patch carries exactly what
//! [`crate::inject::inject_template`] did and nothing the webhook would have to keep in step.
//!
//! The difference is small and readable where the change is an insertion: new keys are `add`ed,
//! items inserted into a list (the sidecar before the other init containers, volumes, mounts and
//! variables after theirs) are `add`ed at their index, lists of the same length are compared
//! item by item; anything else is a `replace` of the smallest value that differs.

use serde::Serialize;
use serde_json::Value;

/// One operation.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Operation {
    /// Inserts `value` at `path` (into an object, or before the list item at that index).
    Add {
        /// A JSON pointer.
        path: String,
        /// The new value.
        value: Value,
    },
    /// Removes the value at `path`.
    Remove {
        /// A JSON pointer.
        path: String,
    },
    /// Replaces the value at `path`.
    Replace {
        /// A JSON pointer.
        path: String,
        /// The new value.
        value: Value,
    },
}

/// The operations that turn `before` into `after`, in the order they apply.
pub fn diff(before: &Value, after: &Value) -> Vec<Operation> {
    let mut operations = Vec::new();
    let mut path = String::new();
    diff_at(&mut path, before, after, &mut operations);
    operations
}

fn diff_at(path: &mut String, before: &Value, after: &Value, out: &mut Vec<Operation>) {
    if before == after {
        return;
    }
    match (before, after) {
        (Value::Object(old), Value::Object(new)) => {
            for key in old.keys().filter(|key| !new.contains_key(*key)) {
                out.push(Operation::Remove {
                    path: child(path, key),
                });
            }
            for (key, value) in new {
                match old.get(key) {
                    Some(previous) => {
                        let len = path.len();
                        push_token(path, key);
                        diff_at(path, previous, value, out);
                        path.truncate(len);
                    }
                    None => out.push(Operation::Add {
                        path: child(path, key),
                        value: value.clone(),
                    }),
                }
            }
        }
        (Value::Array(old), Value::Array(new)) => {
            if let Some(inserted) = insertions(old, new) {
                for index in inserted {
                    out.push(Operation::Add {
                        path: child(path, &index.to_string()),
                        value: new[index].clone(),
                    });
                }
            } else if old.len() == new.len() {
                for (index, (previous, value)) in old.iter().zip(new).enumerate() {
                    let len = path.len();
                    push_token(path, &index.to_string());
                    diff_at(path, previous, value, out);
                    path.truncate(len);
                }
            } else {
                out.push(replace(path, after));
            }
        }
        _ => out.push(replace(path, after)),
    }
}

/// When `new` is `old` with items inserted (every item of `old` equal and in order), the
/// indexes in `new` of the inserted items, ascending: adding them in that order rebuilds `new`.
fn insertions(old: &[Value], new: &[Value]) -> Option<Vec<usize>> {
    if new.len() <= old.len() {
        return None;
    }
    let mut kept = 0;
    let mut inserted = Vec::with_capacity(new.len() - old.len());
    for (index, item) in new.iter().enumerate() {
        if kept < old.len() && old[kept] == *item {
            kept += 1;
        } else {
            inserted.push(index);
        }
    }
    (kept == old.len()).then_some(inserted)
}

fn replace(path: &str, value: &Value) -> Operation {
    Operation::Replace {
        path: path.to_owned(),
        value: value.clone(),
    }
}

fn child(path: &str, token: &str) -> String {
    let mut path = path.to_owned();
    push_token(&mut path, token);
    path
}

/// Appends `/token`, escaped as RFC 6901 says (`~` as `~0`, `/` as `~1`).
fn push_token(path: &mut String, token: &str) {
    path.push('/');
    for c in token.chars() {
        match c {
            '~' => path.push_str("~0"),
            '/' => path.push_str("~1"),
            c => path.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// The operations as JSON, by path (operations on different paths commute).
    fn ops(before: &Value, after: &Value) -> Value {
        let mut ops: Vec<Value> = diff(before, after)
            .iter()
            .map(|op| serde_json::to_value(op).expect("json"))
            .collect();
        ops.sort_by(|a, b| a["path"].as_str().cmp(&b["path"].as_str()));
        Value::Array(ops)
    }

    #[test]
    fn insertions_are_adds_at_their_index_and_keys_are_escaped() {
        let before = json!({
            "metadata": {"labels": {"app": "a"}},
            "spec": {"initContainers": [{"name": "x"}], "containers": [{"name": "a"}]}
        });
        let after = json!({
            "metadata": {"labels": {"app": "a", "sluice.io/injected": "true", "a~b": "c"}},
            "spec": {
                "initContainers": [{"name": "sluice"}, {"name": "x"}],
                "containers": [{"name": "a", "env": [{"name": "E"}]}],
                "volumes": [{"name": "v"}]
            }
        });
        assert_eq!(
            ops(&before, &after),
            json!([
                {"op": "add", "path": "/metadata/labels/a~0b", "value": "c"},
                {"op": "add", "path": "/metadata/labels/sluice.io~1injected", "value": "true"},
                {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "E"}]},
                {"op": "add", "path": "/spec/initContainers/0", "value": {"name": "sluice"}},
                {"op": "add", "path": "/spec/volumes", "value": [{"name": "v"}]},
            ])
        );
        assert!(diff(&after, &after).is_empty());
    }

    #[test]
    fn other_changes_replace_or_remove() {
        let before = json!({"a": [1, 2, 3], "b": 1, "c": true, "d": [1, 2]});
        let after = json!({"a": [3, 1], "b": "1", "d": [1, 5]});
        assert_eq!(
            ops(&before, &after),
            json!([
                {"op": "replace", "path": "/a", "value": [3, 1]},
                {"op": "replace", "path": "/b", "value": "1"},
                {"op": "remove", "path": "/c"},
                {"op": "replace", "path": "/d/1", "value": 5},
            ])
        );
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            (0i64..3).prop_map(Value::from),
            "[a~/]{0,2}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map("[ab~/]{1,2}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// An item inserted into every outermost list of `value` (at positions drawn from `seed`).
    fn with_insertions(value: &Value, seed: &mut u64) -> Value {
        let mut next = || {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (*seed >> 33) as usize
        };
        match value {
            Value::Array(items) => {
                let mut items = items.clone();
                let at = next() % (items.len() + 1);
                items.insert(at, json!({"inserted": at}));
                Value::Array(items)
            }
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (k.clone(), with_insertions(v, seed)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    fn apply(before: &Value, operations: &[Operation]) -> Value {
        let patch: json_patch::Patch =
            serde_json::from_value(serde_json::to_value(operations).expect("json"))
                .expect("a valid RFC 6902 patch");
        let mut document = before.clone();
        json_patch::patch(&mut document, &patch).expect("the patch applies");
        document
    }

    proptest! {
        /// An independent RFC 6902 implementation turns `before` into `after` with the patch.
        #[test]
        fn the_patch_rebuilds_the_target(before in json_value(), after in json_value(), seed: u64) {
            prop_assert_eq!(apply(&before, &diff(&before, &after)), after);
            let mut seed = seed;
            let inserted = with_insertions(&before, &mut seed);
            let operations = diff(&before, &inserted);
            prop_assert!(
                operations.iter().all(|op| matches!(op, Operation::Add { .. })),
                "{:?}", operations
            );
            prop_assert_eq!(apply(&before, &operations), inserted);
        }
    }
}
