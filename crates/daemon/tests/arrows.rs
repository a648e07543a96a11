//! The daemon's module arrows, as ARCHITECTURE.md draws them: each top-level module may name
//! (`crate::NAME`) only the modules listed for it. The packages' arrows are the compiler's; these,
//! inside one crate, are this test's.

use std::collections::BTreeSet;
use std::path::Path;

/// Each module and the modules it may use (`app` may use all of them).
const ALLOWED: &[(&str, &[&str])] = &[
    ("limit", &[]),
    ("logging", &[]),
    ("process_cpu", &[]),
    ("clock", &["limit"]),
    ("client", &["limit"]),
    ("config", &["limit"]),
    ("telemetry", &["config", "logging", "process_cpu"]),
    ("store", &["limit", "clock", "config", "telemetry"]),
    ("tenants", &["config", "store", "telemetry"]),
    (
        "check",
        &[
            "limit",
            "clock",
            "config",
            "logging",
            "store",
            "telemetry",
            "tenants",
        ],
    ),
    (
        "transport",
        &[
            "check",
            "clock",
            "config",
            "limit",
            "logging",
            "store",
            "telemetry",
        ],
    ),
    ("reload", &["check", "config", "limit", "telemetry"]),
];

/// Every `crate::NAME` a file names.
fn named(text: &str, into: &mut BTreeSet<String>) {
    for (at, _) in text.match_indices("crate::") {
        if text[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue; // `sluice_k8s::crate::...` cannot occur; `$crate::` in macros is the same
        }
        let name: String = text[at + 7..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            into.insert(name);
        }
    }
}

/// The files of module `name`: `src/NAME.rs` and everything under `src/NAME/`.
fn files(src: &Path, name: &str, into: &mut Vec<std::path::PathBuf>) {
    let file = src.join(format!("{name}.rs"));
    if file.is_file() {
        into.push(file);
    }
    let mut dirs = vec![src.join(name)];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                into.push(path);
            }
        }
    }
}

#[test]
fn each_module_names_only_the_modules_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut broken = Vec::new();
    for (module, allowed) in ALLOWED {
        let mut paths = Vec::new();
        files(&src, module, &mut paths);
        assert!(!paths.is_empty(), "no files for module {module}");
        for path in paths {
            let mut names = BTreeSet::new();
            named(&std::fs::read_to_string(&path).expect("read"), &mut names);
            for name in names {
                if name != *module && !allowed.contains(&name.as_str()) {
                    broken.push(format!("{} uses crate::{name}", path.display()));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "arrows ARCHITECTURE.md does not draw:\n{}",
        broken.join("\n")
    );
}

#[test]
fn every_module_of_the_library_is_placed() {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
        .expect("lib.rs");
    for line in lib.lines() {
        if let Some(name) = line
            .strip_prefix("pub mod ")
            .and_then(|l| l.strip_suffix(';'))
        {
            assert!(
                name == "app" || ALLOWED.iter().any(|(m, _)| *m == name),
                "module {name} has no place in ALLOWED (app alone may use everything)"
            );
        }
    }
}

/// What the HTTP/2 package (`crates/http2`) may depend on. It cannot name the daemon: the
/// dependency points the other way, and the compiler refuses a cycle. This keeps anything of
/// gRPC (tonic, prost, hyper) and every sluice package out of it too.
const HTTP2_DEPENDENCIES: &[&str] = &[
    "bytes",
    "futures-util",
    "http",
    "memchr",
    "tokio",
    "tokio-util",
    "tracing",
];

#[test]
fn the_http2_package_depends_on_nothing_of_grpc_or_the_daemon() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../http2/Cargo.toml");
    let text = std::fs::read_to_string(manifest).expect("crates/http2/Cargo.toml");
    let section = text
        .split("\n[dependencies]\n")
        .nth(1)
        .expect("a [dependencies] section");
    let section = section.split("\n[").next().unwrap_or(section);
    let mut unexpected = Vec::new();
    for line in section.lines() {
        let name: String = line
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .collect();
        if !name.is_empty() && !HTTP2_DEPENDENCIES.contains(&name.as_str()) {
            unexpected.push(name);
        }
    }
    assert!(
        unexpected.is_empty(),
        "crates/http2 depends on {unexpected:?}, beyond {HTTP2_DEPENDENCIES:?}"
    );
}
