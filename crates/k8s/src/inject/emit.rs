//! Writes a YAML value back as block-style YAML that YAML 1.1 readers (kubectl's go-yaml,
//! PyYAML) read exactly as written: any string that could be taken for something else (`yes`,
//! `on`, `2024-01-01`, `1:20`, `0666`) is double-quoted; multi-line strings become literal blocks.
//! serde_yaml's own emitter follows YAML 1.2 only and leaves such strings bare.

use std::fmt::Write;

use serde_yaml::Value;

/// Words that YAML 1.1 or 1.2 reads as booleans or null, compared in lowercase.
const SPECIAL_WORDS: [&str; 12] = [
    "y", "n", "yes", "no", "on", "off", "true", "false", "null", "~", "nan", "inf",
];

/// One document, ending with a newline (no `---`; join documents with `---\n`).
pub fn document(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Mapping(map) if !map.is_empty() => mapping(&mut out, map, 0, false),
        Value::Sequence(seq) if !seq.is_empty() => sequence(&mut out, seq, 0),
        other => {
            inline(&mut out, other, 0);
            out.push('\n');
        }
    }
    out
}

fn pad(out: &mut String, indent: usize) {
    out.push_str(&" ".repeat(indent));
}

/// `after_dash`: the first entry follows a sequence item's `- ` on the same line.
fn mapping(out: &mut String, map: &serde_yaml::Mapping, indent: usize, after_dash: bool) {
    for (i, (key, value)) in map.iter().enumerate() {
        if i > 0 || !after_dash {
            pad(out, indent);
        }
        match key {
            // A key is never a literal block.
            Value::String(s) if !is_plain_safe(s) => {
                out.push_str(&serde_json::Value::String(s.clone()).to_string())
            }
            other => inline(out, other, indent),
        }
        out.push(':');
        child(out, value, indent);
    }
}

fn sequence(out: &mut String, seq: &[Value], indent: usize) {
    for item in seq {
        pad(out, indent);
        out.push('-');
        match item {
            Value::Mapping(map) if !map.is_empty() => {
                out.push(' ');
                mapping(out, map, indent + 2, true);
            }
            Value::Sequence(inner) if !inner.is_empty() => {
                out.push('\n');
                sequence(out, inner, indent + 2);
            }
            other => {
                out.push(' ');
                inline(out, other, indent + 2);
                out.push('\n');
            }
        }
    }
}

/// The value of a mapping entry, after its `key:`.
fn child(out: &mut String, value: &Value, indent: usize) {
    match value {
        Value::Mapping(map) if !map.is_empty() => {
            out.push('\n');
            mapping(out, map, indent + 2, false);
        }
        Value::Sequence(seq) if !seq.is_empty() => {
            out.push('\n');
            sequence(out, seq, indent + 2);
        }
        Value::Tagged(tagged) if is_collection(&tagged.value) => {
            let _ = write!(out, " {}", tagged.tag);
            child(out, &tagged.value, indent);
        }
        other => {
            out.push(' ');
            inline(out, other, indent + 2);
            out.push('\n');
        }
    }
}

fn is_collection(value: &Value) -> bool {
    matches!(value, Value::Mapping(m) if !m.is_empty())
        || matches!(value, Value::Sequence(s) if !s.is_empty())
}

/// A scalar, an empty collection, or a literal block whose lines are indented by `indent`.
fn inline(out: &mut String, value: &Value, indent: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => string(out, s, indent),
        Value::Sequence(_) => out.push_str("[]"),
        Value::Mapping(_) => out.push_str("{}"),
        Value::Tagged(tagged) => {
            let _ = write!(out, "{} ", tagged.tag);
            inline(out, &tagged.value, indent);
        }
    }
}

fn string(out: &mut String, s: &str, indent: usize) {
    if is_plain_safe(s) {
        out.push_str(s);
    } else if is_literal_safe(s) {
        literal(out, s, indent);
    } else {
        // A JSON string is a valid YAML double-quoted scalar, escapes included.
        out.push_str(&serde_json::Value::String(s.to_owned()).to_string());
    }
}

/// Conservative: letters first, a small character set, nothing any YAML version reads as
/// another type, no `: ` or ` #`.
fn is_plain_safe(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    (first.is_ascii_alphabetic() || first == '/' || first == '_')
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric()
                || " _./:@%+=,()-".contains(c)
                || (!c.is_ascii() && c.is_alphanumeric())
        })
        && !s.ends_with([' ', ':'])
        && !s.contains(": ")
        && !s.contains(" #")
        && !SPECIAL_WORDS.contains(&s.to_ascii_lowercase().as_str())
}

/// Multi-line text without characters a literal block cannot hold as is.
fn is_literal_safe(s: &str) -> bool {
    s.contains('\n')
        && !s.starts_with([' ', '\n', '\t'])
        && !s.chars().any(|c| c.is_control() && c != '\n' && c != '\t')
        && !s.trim_end_matches('\n').is_empty()
        && !s.contains(" \n")
        && !s.contains("\t\n")
}

fn literal(out: &mut String, s: &str, indent: usize) {
    let body = s.trim_end_matches('\n');
    let trailing = s.len() - body.len();
    out.push_str(match trailing {
        0 => "|-",
        1 => "|",
        _ => "|+",
    });
    for line in body.split('\n') {
        out.push('\n');
        if !line.is_empty() {
            pad(out, indent);
            out.push_str(line);
        }
    }
    for _ in 1..trailing {
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(value: &Value) -> Value {
        let text = document(value);
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    #[test]
    fn ambiguous_strings_are_quoted_and_survive() {
        for s in [
            "yes",
            "No",
            "on",
            "OFF",
            "y",
            "~",
            "null",
            "true",
            "2024-01-01",
            "1:20",
            "0666",
            "3",
            "1e3",
            "-1",
            ".inf",
            "",
            " lead",
            "trail ",
            "a: b",
            "x #y",
            "#x",
            "@x",
            "*x",
            "&x",
            "!x",
            "%x",
            "[x]",
            "{x}",
            "a\"b",
            "back\\slash",
            "tab\there",
            "é",
            "- x",
            "? x",
        ] {
            let value = Value::String(s.into());
            assert_eq!(round_trip(&value), value, "{s:?}");
            if !s.is_empty() && s != "é" && s.parse::<f64>().is_err() {
                let text = document(&value);
                let plain = !text.starts_with('"');
                assert!(!plain || is_plain_safe(s), "{s:?} emitted plain: {text}");
            }
        }
        assert_eq!(document(&Value::String("yes".into())), "\"yes\"\n");
        assert_eq!(
            document(&Value::String("2024-01-01".into())),
            "\"2024-01-01\"\n"
        );
        assert_eq!(
            document(&Value::String("nginx:1.27".into())),
            "nginx:1.27\n"
        );
    }

    #[test]
    fn multi_line_strings_round_trip() {
        for s in [
            "a\nb\n",
            "a\nb",
            "a\n\nb\n\n\n",
            "script:\n  - indented\n# comment\n",
            " starts with space\nx\n",
            "trailing space \nx",
            "\nleading newline",
        ] {
            let map: Value = serde_yaml::from_str(&format!(
                "k:\n  - {}\n",
                serde_json::Value::String(s.into())
            ))
            .expect("fixture");
            assert_eq!(round_trip(&map), map, "{s:?}\n{}", document(&map));
        }
    }

    #[test]
    fn structures_round_trip_in_order() {
        let text =
            "b: 1\na:\n  - x: {}\n    y: []\n  - - 1\n    - 2\n  - null\nc: !tag 5\nd: 1.5\n";
        let value: Value = serde_yaml::from_str(text).expect("fixture");
        assert_eq!(round_trip(&value), value);
        let emitted = document(&value);
        assert!(emitted.starts_with("b: 1\na:\n"), "{emitted}");
    }
}
