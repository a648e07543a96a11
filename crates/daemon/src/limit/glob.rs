//! Globs in descriptor values: `*` anywhere matches any run of characters (none included, `/`
//! included), as envoyproxy/ratelimit's wildcard values do. A glob is its literal parts between
//! the stars; matching is a prefix test, a suffix test and one left-to-right substring search per
//! middle part, so the work is linear in the value whatever the pattern (no backtracking: the
//! leftmost place for each middle part is always as good as any later one).

/// A value pattern with at least one `*`, other than `*` alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    /// The literal text around and between the stars: one more than there are stars; the first
    /// and last may be empty (a leading or trailing `*`), the others never are (`**` is refused).
    parts: Vec<String>,
}

impl Glob {
    /// Reads `text` as a glob; `Ok(None)` when it has no `*`. Refused: `**` (two stars in a row
    /// would read as something else in other globs, such as "across `/`"; one `*` already
    /// matches any run) and `\*` (there are no escapes: a `*` is always a wildcard).
    pub fn parse(text: &str) -> Result<Option<Self>, String> {
        if !text.contains('*') {
            return Ok(None);
        }
        if text.contains("**") {
            return Err(format!(
                "{text:?} has `**`: one `*` already matches any run of characters, `/` included; \
                 write a single `*`"
            ));
        }
        if text.contains("\\*") {
            return Err(format!(
                "{text:?} has `\\*`: values have no escapes and every `*` matches any run of \
                 characters; a literal `*` cannot be matched"
            ));
        }
        Ok(Some(Self {
            parts: text.split('*').map(str::to_owned).collect(),
        }))
    }

    /// Whether `value` fits, in time linear in `value`'s length.
    pub fn matches(&self, value: &str) -> bool {
        let (Some((first, rest)), Some(last)) = (self.parts.split_first(), self.parts.last())
        else {
            return false;
        };
        let middle = &rest[..rest.len().saturating_sub(1)];
        if value.len() < first.len() + last.len()
            || !value.starts_with(first.as_str())
            || !value.ends_with(last.as_str())
        {
            return false;
        }
        // Both ends are char boundaries: `value` starts with `first` and ends with `last`.
        let mut rest = &value[first.len()..value.len() - last.len()];
        for part in middle {
            match rest.find(part.as_str()) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }

    /// How many literal characters the glob has: more is more specific.
    pub fn literal_chars(&self) -> usize {
        self.parts.iter().map(|p| p.chars().count()).sum()
    }

    /// The same glob with its literal text lowercased (for case-insensitive path matching).
    pub fn lowercased(&self) -> Self {
        Self {
            parts: self.parts.iter().map(|p| p.to_lowercase()).collect(),
        }
    }
}

impl std::fmt::Display for Glob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.parts.join("*"))
    }
}

/// Whether some value fits both `a` and `b`, each a value pattern in glob syntax (`*` anywhere,
/// no escapes; text without `*` is one exact value): a walk over the pairs of positions in the
/// two patterns, so at most `(|a| + 1) x (|b| + 1)` steps.
pub fn globs_overlap(a: &str, b: &str) -> bool {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let width = b.len() + 1;
    let mut seen = vec![false; (a.len() + 1) * width];
    let mut todo = vec![(0, 0)];
    while let Some((i, j)) = todo.pop() {
        if std::mem::replace(&mut seen[i * width + j], true) {
            continue;
        }
        if i == a.len() && j == b.len() {
            return true;
        }
        let (x, y) = (a.get(i).copied(), b.get(j).copied());
        // A star may match nothing; a star against a character eats it; equal characters pair.
        if x == Some('*') {
            todo.push((i + 1, j));
            if y.is_some() {
                todo.push((i, j + 1));
            }
        }
        if y == Some('*') {
            todo.push((i, j + 1));
            if x.is_some() {
                todo.push((i + 1, j));
            }
        }
        if let (Some(x), Some(y)) = (x, y) {
            if x == y && x != '*' {
                todo.push((i + 1, j + 1));
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The textbook definition, by recursion over both strings (exponential, for tests only).
    fn reference(pattern: &[char], value: &[char]) -> bool {
        match pattern.split_first() {
            None => value.is_empty(),
            Some(('*', rest)) => (0..=value.len()).any(|skip| reference(rest, &value[skip..])),
            Some((c, rest)) => value.first() == Some(c) && reference(rest, &value[1..]),
        }
    }

    fn glob(text: &str) -> Glob {
        Glob::parse(text).expect("valid").expect("a glob")
    }

    #[test]
    fn stars_anywhere_match_any_run() {
        let items = glob("/v1/orders/*/items");
        assert!(items.matches("/v1/orders/123/items"));
        assert!(items.matches("/v1/orders//items"), "a run may be empty");
        assert!(items.matches("/v1/orders/a/b/items"), "and span `/`");
        assert!(!items.matches("/v1/orders/123/items/x"));
        assert!(!items.matches("/v1/orders/items"));
        assert!(glob("*.example.com").matches("a.example.com"));
        assert!(!glob("*.example.com").matches("example.com"));
        assert!(
            glob("a*a").matches("aa") && !glob("a*a").matches("a"),
            "no overlap"
        );
        assert!(glob("é*ß").matches("éxß"), "char boundaries");
    }

    #[test]
    fn ambiguous_spellings_are_refused() {
        assert!(Glob::parse("/v1/**").is_err());
        assert!(Glob::parse("/v1/\\*").is_err());
        assert_eq!(Glob::parse("/v1/x").expect("fine"), None);
    }

    #[test]
    fn hostile_values_take_linear_work() {
        // `a*a*...*b` against `aaaa...`: a backtracking matcher takes exponential time here.
        let pattern = format!("*{}b*", "a*".repeat(64));
        let value = "a".repeat(100_000);
        assert!(!glob(&pattern).matches(&value));
        assert!(glob(&pattern).matches(&format!("{value}b")));
        assert!(!glob(&format!("{}b", "a*".repeat(64))).matches(&value));
    }

    #[test]
    fn overlaps_are_found_exactly() {
        assert!(globs_overlap("ab*", "a*"));
        assert!(globs_overlap("*x", "x*"));
        assert!(globs_overlap("a*c", "abc"));
        assert!(!globs_overlap("a*c", "abd"));
        assert!(!globs_overlap("*.com", "*.org"));
        assert!(globs_overlap("x", "x") && !globs_overlap("x", "y"));
    }

    proptest! {
        #[test]
        fn the_matcher_agrees_with_the_definition(
            pattern in "[ab/*]{0,10}",
            value in "[ab/]{0,14}",
        ) {
            let chars: Vec<char> = pattern.chars().collect();
            let expected = reference(&chars, &value.chars().collect::<Vec<_>>());
            match Glob::parse(&pattern) {
                Ok(Some(glob)) => prop_assert_eq!(glob.matches(&value), expected),
                Ok(None) => prop_assert_eq!(pattern == value, expected),
                Err(_) => prop_assert!(pattern.contains("**")),
            }
        }

        #[test]
        fn overlap_means_a_common_value(a in "[ab*]{0,4}", b in "[ab*]{0,4}") {
            prop_assume!(!a.contains("**") && !b.contains("**"));
            let fits = |p: &str, v: &str| {
                reference(&p.chars().collect::<Vec<_>>(), &v.chars().collect::<Vec<_>>())
            };
            // A common value, if any, is at most as long as both patterns' letters together.
            let values = (0..=8u32).flat_map(|len| {
                (0..1u32 << len).map(move |bits| {
                    (0..len).map(|i| if bits >> i & 1 == 1 { 'b' } else { 'a' }).collect::<String>()
                })
            });
            let common = values.into_iter().any(|v| fits(&a, &v) && fits(&b, &v));
            prop_assert_eq!(globs_overlap(&a, &b), common);
        }
    }
}
