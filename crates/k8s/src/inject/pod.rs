//! Adds the sidecar to one pod spec (and its labels), idempotently: what is already there and
//! equal is kept, what is there and different is a conflict unless `overwrite` is set.

use serde_yaml::{Mapping, Value};

use super::sidecar::{self, Options};

/// What went wrong with one pod; the caller adds which document it was.
pub type Conflict = String;

/// Injects into `spec` (a PodSpec) and `labels` (the pod's labels, created when absent).
/// Returns whether anything changed. `template` checks what rules a pod out first
/// (`hostNetwork`, its `sluice.io/*` settings).
pub fn inject(
    spec: &mut Mapping,
    labels: &mut Value,
    options: &Options,
    replicas: u64,
) -> Result<bool, Conflict> {
    let mut changed = false;
    changed |= place_sidecar(spec, options, replicas)?;
    for volume in sidecar::volumes(options) {
        changed |= upsert_named(list(spec, "volumes")?, volume, "volume", options.overwrite)?;
    }
    let containers = list(spec, "containers")?;
    if containers.is_empty() {
        return Err("the pod has no containers".into());
    }
    for app in containers.iter_mut() {
        changed |= inject_app(app, options.overwrite)?;
    }
    changed |= add_label(labels, options.overwrite)?;
    Ok(changed)
}

/// The sidecar goes first among the init containers, so every later init container and every
/// application container finds it started (and its startup probe passed).
fn place_sidecar(spec: &mut Mapping, options: &Options, replicas: u64) -> Result<bool, Conflict> {
    let desired = sidecar::container(options, replicas);
    let containers = list(spec, "containers")?;
    if let Some(index) = position(containers, sidecar::CONTAINER) {
        if !options.overwrite {
            return Err(format!(
                "a container named {:?} is in containers, not a native sidecar in \
                 initContainers; pass --overwrite to move it",
                sidecar::CONTAINER
            ));
        }
        containers.remove(index);
        let init = list(spec, "initContainers")?;
        remove_named(init, sidecar::CONTAINER);
        init.insert(0, desired);
        return Ok(true);
    }
    let init = list(spec, "initContainers")?;
    match position(init, sidecar::CONTAINER) {
        None => {
            init.insert(0, desired);
            Ok(true)
        }
        Some(index) if equivalent(&init[index], &desired) => Ok(false),
        Some(index) if options.overwrite => {
            init[index] = desired;
            Ok(true)
        }
        Some(index) => Err(format!(
            "a container named {:?} already exists with other settings ({}); pass --overwrite \
             to replace it",
            sidecar::CONTAINER,
            differing_fields(&init[index], &desired).join(", ")
        )),
    }
}

/// The socket mount and the client variables of one application container.
fn inject_app(app: &mut Value, overwrite: bool) -> Result<bool, Conflict> {
    let name = app
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_owned();
    let Some(app) = app.as_mapping_mut() else {
        return Err(format!("container {name:?} is not a mapping"));
    };
    let at = |e: Conflict| format!("container {name:?}: {e}");
    let mut changed = false;
    let mounts = list(app, "volumeMounts").map_err(at)?;
    let taken = mounts.iter().any(|m| {
        m.get("mountPath").and_then(Value::as_str) == Some(sidecar::SOCKET_DIR)
            && m.get("name").and_then(Value::as_str) != Some(sidecar::SOCKET_VOLUME)
    });
    if taken && !overwrite {
        return Err(at(format!(
            "{} is already mounted from another volume; pass --overwrite to replace it",
            sidecar::SOCKET_DIR
        )));
    }
    if taken {
        mounts.retain(|m| m.get("mountPath").and_then(Value::as_str) != Some(sidecar::SOCKET_DIR));
        changed = true;
    }
    changed |= upsert_named(mounts, sidecar::app_mount(), "volumeMount", overwrite).map_err(at)?;
    let env = list(app, "env").map_err(at)?;
    for var in sidecar::app_env() {
        changed |= upsert_named(env, var, "variable", overwrite).map_err(at)?;
    }
    Ok(changed)
}

/// Merges [`sidecar::MESH_EXCLUDED_PORTS`] into the pod's Istio `excludeInboundPorts`
/// annotation (created when absent; the ports already listed are kept as written).
pub fn exclude_from_mesh(annotations: &mut Value) -> Result<bool, Conflict> {
    if annotations.is_null() {
        *annotations = Value::Mapping(Mapping::new());
    }
    let Some(annotations) = annotations.as_mapping_mut() else {
        return Err("annotations is not a mapping".into());
    };
    let key = sidecar::ISTIO_EXCLUDE_INBOUND;
    let listed = match annotations.get(key) {
        None => "",
        Some(Value::String(text)) => text.as_str(),
        Some(other) => return Err(format!("annotation {key} is {other:?}, not a string")),
    };
    let mut ports: Vec<String> = listed
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    let before = ports.len();
    for port in sidecar::MESH_EXCLUDED_PORTS {
        let port = port.to_string();
        if !ports.contains(&port) {
            ports.push(port);
        }
    }
    if ports.len() == before {
        return Ok(false);
    }
    annotations.insert(key.into(), Value::String(ports.join(",")));
    Ok(true)
}

fn add_label(labels: &mut Value, overwrite: bool) -> Result<bool, Conflict> {
    if labels.is_null() {
        *labels = Value::Mapping(Mapping::new());
    }
    let Some(labels) = labels.as_mapping_mut() else {
        return Err("labels is not a mapping".into());
    };
    let desired = Value::String("true".into());
    match labels.get(sidecar::LABEL) {
        Some(value) if *value == desired => Ok(false),
        Some(value) if !overwrite => Err(format!(
            "label {} is {value:?}, not \"true\"; pass --overwrite to replace it",
            sidecar::LABEL
        )),
        _ => {
            labels.insert(sidecar::LABEL.into(), desired);
            Ok(true)
        }
    }
}

/// Adds `item` to `items` unless one with its name exists: equal is kept, different is a conflict
/// (or replaced in place when `overwrite`).
fn upsert_named(
    items: &mut Vec<Value>,
    item: Value,
    what: &str,
    overwrite: bool,
) -> Result<bool, Conflict> {
    let name = item.get("name").and_then(Value::as_str).unwrap_or_default();
    match position(items, name) {
        None => {
            items.push(item);
            Ok(true)
        }
        Some(index) if equivalent(&items[index], &item) => Ok(false),
        Some(index) if overwrite => {
            items[index] = item;
            Ok(true)
        }
        Some(index) => Err(format!(
            "a {what} named {name:?} already exists with other settings ({}); pass --overwrite \
             to replace it",
            differing_fields(&items[index], &item).join(", ")
        )),
    }
}

/// The sequence under `key`, created empty when absent (a `null` counts as absent).
fn list<'a>(map: &'a mut Mapping, key: &str) -> Result<&'a mut Vec<Value>, Conflict> {
    let slot = map
        .entry(Value::String(key.into()))
        .or_insert(Value::Sequence(Vec::new()));
    if slot.is_null() {
        *slot = Value::Sequence(Vec::new());
    }
    slot.as_sequence_mut()
        .ok_or_else(|| format!("{key} is not a list"))
}

fn position(items: &[Value], name: &str) -> Option<usize> {
    items
        .iter()
        .position(|item| item.get("name").and_then(Value::as_str) == Some(name))
}

fn remove_named(items: &mut Vec<Value>, name: &str) {
    items.retain(|item| item.get("name").and_then(Value::as_str) != Some(name));
}

/// Equal once lists of named objects (env, ports, mounts) are put in name order: kustomize's
/// strategic merge moves patched items first, which changes nothing for Kubernetes.
fn equivalent(a: &Value, b: &Value) -> bool {
    a == b || normalized(a) == normalized(b)
}

fn normalized(value: &Value) -> Value {
    match value {
        Value::Mapping(map) => Value::Mapping(
            map.iter()
                .map(|(k, v)| (k.clone(), normalized(v)))
                .collect(),
        ),
        Value::Sequence(items) => {
            let mut items: Vec<Value> = items.iter().map(normalized).collect();
            if items
                .iter()
                .all(|i| i.get("name").and_then(Value::as_str).is_some())
            {
                items.sort_by(|x, y| x["name"].as_str().cmp(&y["name"].as_str()));
            }
            Value::Sequence(items)
        }
        other => other.clone(),
    }
}

/// Top-level fields whose values differ, for a conflict message.
fn differing_fields(current: &Value, desired: &Value) -> Vec<String> {
    let (Some(current), Some(desired)) = (current.as_mapping(), desired.as_mapping()) else {
        return vec!["not a mapping".into()];
    };
    let mut fields: Vec<String> = desired
        .iter()
        .filter(|(k, v)| !current.get(*k).is_some_and(|c| equivalent(c, v)))
        .chain(current.iter().filter(|(k, _)| !desired.contains_key(*k)))
        .filter_map(|(k, _)| k.as_str().map(str::to_owned))
        .collect();
    fields.dedup();
    fields
}
