//! Settings errors in sluice's words: figment reports `default.listen.http` and serde's
//! "expected a string"; an operator needs the key as sluice documents it (`listen.http`), the
//! variable that sets it (`SLUICE_LISTEN__HTTP`), where the bad value came from and the form
//! the key takes ("an address such as \"127.0.0.1:7070\"").

use figment::error::Kind;
use figment::Source;

/// Keys whose form serde cannot name (they are read as plain strings and parsed after).
const FORMS: [(&str, &str); 4] = [
    (
        "listen.http",
        "an address such as \"127.0.0.1:7070\" (\"\" disables it)",
    ),
    ("listen.admin", "an address such as \"127.0.0.1:7071\""),
    (
        "listen.grpc",
        "an address such as \"127.0.0.1:8081\" (\"\" disables it)",
    ),
    ("listen.socket_mode", "an octal permission such as \"0660\""),
];

/// One line per problem figment found, each naming the key, its variable and the source.
pub fn describe(error: figment::Error) -> String {
    error
        .into_iter()
        .map(|one| line(&one))
        .collect::<Vec<_>>()
        .join("\n")
}

fn line(error: &figment::Error) -> String {
    let key = error.path.join(".");
    let variable = format!("SLUICE_{}", error.path.join("__").to_uppercase());
    let from_env = error
        .metadata
        .as_ref()
        .is_some_and(|meta| meta.name.contains("environment"));
    let from = match error
        .metadata
        .as_ref()
        .and_then(|meta| meta.source.as_ref())
    {
        Some(Source::File(path)) => format!(" (or {variable}), in {}", path.display()),
        _ if from_env => format!(", from {variable}"),
        _ => format!(" ({variable})"),
    };
    let form = |expected: &str| expected_form(&key, expected);
    let problem = match &error.kind {
        Kind::InvalidType(actual, expected) | Kind::InvalidValue(actual, expected) => {
            format!("found {actual}, expected {}", form(expected))
        }
        Kind::InvalidLength(length, expected) => {
            format!("{length} items, expected {}", form(expected))
        }
        Kind::UnknownField(field, known) => {
            let parent = key.strip_suffix(field.as_str()).unwrap_or("");
            let parent = parent.strip_suffix('.').unwrap_or("the top level");
            format!(
                "unknown key `{field}`; {parent} takes {}",
                quoted(known).join(", ")
            )
        }
        Kind::UnknownVariant(value, known) => {
            format!(
                "unknown value {value:?}, expected one of {}",
                quoted(known).join(", ")
            )
        }
        Kind::Message(message) => match FORMS.iter().find(|(k, _)| *k == key) {
            // Untagged enums (socket_mode) only say "did not match any variant".
            Some((_, form)) if message.contains("did not match") => format!("expected {form}"),
            _ => message.clone(),
        },
        other => other.to_string(),
    };
    if key.is_empty() {
        return format!("settings: {problem}");
    }
    format!("{key}{from}: {problem}")
}

/// What a key takes, in words: its entry in [`FORMS`], else serde's expectation translated.
fn expected_form(key: &str, expected: &str) -> String {
    if let Some((_, form)) = FORMS.iter().find(|(k, _)| *k == key) {
        return (*form).to_owned();
    }
    match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number such as 100".to_owned(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "a number such as 100".to_owned(),
        "a boolean" => "true or false".to_owned(),
        "a sequence" => "a list such as [\"a\", \"b\"]".to_owned(),
        "a map" => "a table of keys".to_owned(),
        other => other.to_owned(),
    }
}

fn quoted(names: &[&str]) -> Vec<String> {
    names.iter().map(|name| format!("`{name}`")).collect()
}
