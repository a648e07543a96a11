//! Descriptor patterns: exact values, prefixes, `*`, and path templates such as
//! `/v1/orders/{id}` whose parameters become descriptors. Each pattern has a specificity, used to
//! pick one policy when several of the same group match.

use std::fmt;

/// How a descriptor value is matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// `*`: the descriptor must be present, any value.
    Any,
    /// `/v1/*`: the value must start with the text before the final `*`.
    Prefix(String),
    /// `/v1/orders/{id}`: `/`-separated segments, each literal or a `{name}` parameter matching
    /// one non-empty segment; the parameters' values are captured as descriptors.
    Template(Vec<Segment>),
    /// Anything else: the value must be exactly this.
    Exact(String),
}

/// One segment of a path template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Must equal this text.
    Literal(String),
    /// Matches any one non-empty segment, captured under this name.
    Param(String),
}

/// Descriptor values captured by templates, by parameter name.
pub type Captures = Vec<(String, String)>;

impl Pattern {
    /// Reads the pattern syntax used in policy files; a template's parameter names must be
    /// descriptor-like (`[A-Za-z0-9_.-]`).
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.contains('{') || text.contains('}') {
            return Self::template(text);
        }
        Ok(match text.strip_suffix('*') {
            Some("") => Self::Any,
            Some(prefix) => Self::Prefix(prefix.to_owned()),
            None => Self::Exact(text.to_owned()),
        })
    }

    fn template(text: &str) -> Result<Self, String> {
        let segments = text
            .split('/')
            .map(
                |segment| match segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                    Some(name) if is_param_name(name) => Ok(Segment::Param(name.to_owned())),
                    Some(name) => Err(format!("bad path parameter name {name:?} in {text:?}")),
                    None if segment.contains(['{', '}']) => Err(format!(
                        "a `{{name}}` parameter must be a whole segment in {text:?}"
                    )),
                    None => Ok(Segment::Literal(segment.to_owned())),
                },
            )
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::Template(segments))
    }

    /// Whether `value` fits; template parameters are appended to `captures`.
    pub fn matches(&self, value: &str, captures: &mut Captures) -> bool {
        match self {
            Self::Any => true,
            Self::Prefix(prefix) => value.starts_with(prefix.as_str()),
            Self::Exact(exact) => value == exact,
            Self::Template(segments) => {
                let start = captures.len();
                let mut parts = value.split('/');
                for segment in segments {
                    let fits = match (segment, parts.next()) {
                        (Segment::Literal(text), Some(part)) => part == text,
                        (Segment::Param(name), Some(part)) if !part.is_empty() => {
                            captures.push((name.clone(), part.to_owned()));
                            true
                        }
                        _ => false,
                    };
                    if !fits {
                        captures.truncate(start);
                        return false;
                    }
                }
                let whole = parts.next().is_none();
                if !whole {
                    captures.truncate(start);
                }
                whole
            }
        }
    }

    /// How specific the pattern is: exact > template > prefix (longer is more specific) > any.
    pub fn specificity(&self) -> (u8, usize) {
        match self {
            Self::Exact(text) => (4, text.len()),
            Self::Template(segments) => (3, segments.len()),
            Self::Prefix(prefix) => (2, prefix.len()),
            Self::Any => (1, 0),
        }
    }
}

fn is_param_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            Self::Prefix(prefix) => write!(f, "{prefix}*"),
            Self::Exact(exact) => f.write_str(exact),
            Self::Template(segments) => {
                for (i, segment) in segments.iter().enumerate() {
                    if i > 0 {
                        f.write_str("/")?;
                    }
                    match segment {
                        Segment::Literal(text) => f.write_str(text)?,
                        Segment::Param(name) => write!(f, "{{{name}}}")?,
                    }
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fits(pattern: &str, value: &str) -> Option<Captures> {
        let mut captures = Vec::new();
        Pattern::parse(pattern)
            .expect("valid")
            .matches(value, &mut captures)
            .then_some(captures)
    }

    #[test]
    fn exact_prefix_and_any() {
        assert!(fits("*", "anything").is_some());
        assert!(fits("/v1/*", "/v1/orders").is_some());
        assert!(fits("/v1/*", "/v2/orders").is_none());
        assert!(fits("GET", "GET").is_some());
        assert!(fits("GET", "GETX").is_none());
    }

    #[test]
    fn templates_match_whole_segments_and_capture_parameters() {
        assert_eq!(
            fits("/v1/orders/{id}", "/v1/orders/42"),
            Some(vec![("id".into(), "42".into())])
        );
        assert!(fits("/v1/orders/{id}", "/v1/orders/42/items").is_none());
        assert!(fits("/v1/orders/{id}", "/v1/orders/").is_none());
        assert!(fits("/v1/orders/{id}", "/v1/orders").is_none());
        assert_eq!(
            fits("/t/{tenant}/o/{id}", "/t/acme/o/7"),
            Some(vec![
                ("tenant".into(), "acme".into()),
                ("id".into(), "7".into())
            ])
        );
        assert_eq!(
            Pattern::parse("/v1/orders/{id}")
                .expect("valid")
                .to_string(),
            "/v1/orders/{id}"
        );
    }

    #[test]
    fn malformed_templates_are_refused() {
        assert!(Pattern::parse("/v1/x{id}").is_err());
        assert!(Pattern::parse("/v1/{}").is_err());
        assert!(Pattern::parse("/v1/{a b}").is_err());
    }

    #[test]
    fn specificity_orders_kinds_then_length() {
        let spec = |p: &str| Pattern::parse(p).expect("valid").specificity();
        assert!(spec("/v1/search") > spec("/v1/{x}"));
        assert!(spec("/v1/{x}") > spec("/v1/*"));
        assert!(spec("/v1/se*") > spec("/v1/*"));
        assert!(spec("/v1/*") > spec("*"));
    }
}
