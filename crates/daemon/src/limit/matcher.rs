//! Descriptor patterns: exact values, globs (`*` anywhere, [`Glob`]), `*` alone, and path
//! templates such as `/v1/orders/{id}` whose parameters become descriptors. Each pattern has a
//! specificity, used to pick one policy when several of the same group match. A value sluice
//! would read otherwise than it is written is refused: `**`, `\*`, a `*` in a template.

use std::fmt;

use super::glob::Glob;

/// How a descriptor value is matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// `*`: the descriptor must be present, any value.
    Any,
    /// `/v1/*`, `/v1/orders/*/items`, `*.example.com`: each `*` matches any run of characters.
    Glob(Glob),
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
    /// descriptor-like (`[A-Za-z0-9_.-]`), and a template has no `*` (would `/a/*/{id}` capture
    /// the segment after any run, or after one segment?).
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.contains('{') || text.contains('}') {
            if text.contains('*') {
                return Err(format!(
                    "{text:?} mixes `*` and `{{name}}`: a path template matches whole segments \
                     only; use `{{name}}` for the segment or a glob without parameters"
                ));
            }
            return Self::template(text);
        }
        if text == "*" {
            return Ok(Self::Any);
        }
        Ok(match Glob::parse(text)? {
            Some(glob) => Self::Glob(glob),
            None => Self::Exact(text.to_owned()),
        })
    }

    /// The same pattern with its literal text lowercased, for matching lowercased values.
    pub fn lowercased(&self) -> Self {
        match self {
            Self::Any => Self::Any,
            Self::Glob(glob) => Self::Glob(glob.lowercased()),
            Self::Exact(text) => Self::Exact(text.to_lowercase()),
            Self::Template(segments) => Self::Template(
                segments
                    .iter()
                    .map(|segment| match segment {
                        Segment::Literal(text) => Segment::Literal(text.to_lowercase()),
                        Segment::Param(name) => Segment::Param(name.clone()),
                    })
                    .collect(),
            ),
        }
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
        self.matches_kept(value, value, captures)
    }

    /// Whether `compared` fits, capturing template parameters from `kept`: the same value with
    /// its letters as sent when `compared` was lowercased (the two have the same `/`s).
    pub fn matches_kept(&self, compared: &str, kept: &str, captures: &mut Captures) -> bool {
        match self {
            Self::Any => true,
            Self::Glob(glob) => glob.matches(compared),
            Self::Exact(exact) => compared == exact,
            Self::Template(segments) => {
                let start = captures.len();
                let mut parts = compared.split('/').zip(kept.split('/'));
                for segment in segments {
                    let fits = match (segment, parts.next()) {
                        (Segment::Literal(text), Some((part, _))) => part == text,
                        (Segment::Param(name), Some((part, kept))) if !part.is_empty() => {
                            captures.push((name.clone(), kept.to_owned()));
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

    /// How specific the pattern is: exact > template > glob (more literal characters is more
    /// specific: `/v1/orders/*/items` over `/v1/orders/*` over `/v1/*`) > any.
    pub fn specificity(&self) -> (u8, usize) {
        match self {
            Self::Exact(text) => (4, text.chars().count()),
            Self::Template(segments) => (3, segments.len()),
            Self::Glob(glob) => (2, glob.literal_chars()),
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
            Self::Glob(glob) => write!(f, "{glob}"),
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
    fn stars_inside_values_match_any_run() {
        assert!(fits("/v1/orders/*/items", "/v1/orders/123/items").is_some());
        assert!(fits("/v1/orders/*/items", "/v1/orders/123").is_none());
        assert!(fits("*.example.com", "api.example.com").is_some());
        assert_eq!(
            Pattern::parse("/v1/*/items").expect("valid").to_string(),
            "/v1/*/items"
        );
    }

    #[test]
    fn malformed_templates_are_refused() {
        assert!(Pattern::parse("/v1/*/{id}").is_err());
        assert!(Pattern::parse("/v1/{id}*").is_err());
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
        assert!(spec("/v1/orders/*/items") > spec("/v1/orders/*"));
        assert!(spec("/v1/orders/*") > spec("/v1/*/items"));
        assert!(spec("/v1/*") > spec("*"));
    }
}
