//! What policies match against: a request's descriptors, with the `path` descriptor read the way
//! applications route it, so that a spelling cannot walk past a limit. Before matching, a path
//! loses its query and fragment (Envoy's `:path` carries them), its `;` parameters (`/login;jsessionid=1`: Servlet containers strip them), runs of `/`
//! merge and a trailing `/` goes (`/login/`: most frameworks route it to `/login`); and unless a
//! policy says `path_case: exact`, case is ignored (`/LOGIN`: Express, ASP.NET and IIS route
//! case-insensitively). Counting `/LOGIN` on a case-sensitive application spends an attempt on
//! a 404; not counting it on a case-insensitive one is a brute-force bypass, so ignoring case is
//! the default. Every transport (`/v1/check`, `/v1/authz`, gRPC) gets this, since it happens here.

use std::borrow::Cow;

use super::Descriptors;

/// The descriptor whose value is read as a request path.
pub const PATH_DESCRIPTOR: &str = "path";

/// How a policy compares the `path` descriptor's letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathCase {
    /// `/LOGIN` is `/login` (the default: the safe choice when the application's routing is
    /// unknown).
    #[default]
    Insensitive,
    /// Letters must match as written (for applications that route case-sensitively).
    Exact,
}

impl PathCase {
    /// The name used in policy files.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Insensitive => "insensitive",
            Self::Exact => "exact",
        }
    }
}

/// A request's descriptors plus its path in the two forms policies compare, worked out once per
/// request (borrowed when the path needs no change).
pub struct Subject<'a> {
    descriptors: &'a Descriptors,
    /// The path with `;` parameters, repeated and trailing `/` removed; letters as sent.
    path: Option<Cow<'a, str>>,
    /// The same, lowercased.
    folded: Option<Cow<'a, str>>,
}

impl<'a> Subject<'a> {
    /// Reads `descriptors`, preparing the path's forms.
    pub fn new(descriptors: &'a Descriptors) -> Self {
        let path = descriptors.get(PATH_DESCRIPTOR).map(|p| canonical_path(p));
        let folded = path.as_ref().map(fold);
        Self {
            descriptors,
            path,
            folded,
        }
    }

    /// The descriptors as sent.
    pub fn descriptors(&self) -> &'a Descriptors {
        self.descriptors
    }

    /// Descriptor `name` as a policy with `case` compares it, and as its captures and keys
    /// keep it (letters as sent): `(compared, kept)`.
    pub fn value(&self, name: &str, case: PathCase) -> Option<(&str, &str)> {
        if name != PATH_DESCRIPTOR {
            let value = self.descriptors.get(name)?.as_str();
            return Some((value, value));
        }
        let kept = self.path.as_deref()?;
        match case {
            PathCase::Exact => Some((kept, kept)),
            PathCase::Insensitive => Some((self.folded.as_deref()?, kept)),
        }
    }
}

/// `path` without its query or fragment and `;` parameters in any segment, with runs of `/`
/// merged and no trailing `/` (the root stays `/`).
pub fn canonical_path(path: &str) -> Cow<'_, str> {
    let path = path.split(['?', '#']).next().unwrap_or("");
    let trailing = path.len() > 1 && path.ends_with('/');
    if !path.contains(';') && !path.contains("//") && !trailing {
        return Cow::Borrowed(path);
    }
    let leading = path.starts_with('/');
    let mut out = String::with_capacity(path.len());
    for segment in path.split('/') {
        let segment = segment.split(';').next().unwrap_or("");
        if segment.is_empty() {
            continue;
        }
        if leading || !out.is_empty() {
            out.push('/');
        }
        out.push_str(segment);
    }
    if out.is_empty() && leading {
        out.push('/');
    }
    Cow::Owned(out)
}

/// A path value as a policy with `case` compares it and keys it: [`canonical_path`], then
/// lowercased unless `case` is exact.
pub fn path_as_matched(path: &str, case: PathCase) -> Cow<'_, str> {
    let path = canonical_path(path);
    match case {
        PathCase::Exact => path,
        PathCase::Insensitive => fold(&path),
    }
}

/// `text` lowercased, still borrowed when it was and has no uppercase letter.
fn fold<'a>(text: &Cow<'a, str>) -> Cow<'a, str> {
    match text {
        Cow::Borrowed(text) => lowercase(text),
        Cow::Owned(text) => Cow::Owned(lowercase(text).into_owned()),
    }
}

/// `text` lowercased (Unicode), borrowed when it has no uppercase letter.
pub fn lowercase(text: &str) -> Cow<'_, str> {
    if text.chars().any(char::is_uppercase) {
        Cow::Owned(text.to_lowercase())
    } else {
        Cow::Borrowed(text)
    }
}

/// Why a `path` condition as written could never match a path as matched (they lose their
/// query, `;` parameters, repeated and trailing slashes first), if it could not.
pub fn path_pattern_problem(text: &str) -> Option<String> {
    if text.contains(['?', '#']) {
        return Some(format!(
            "{text:?} has `?` or `#`: the query and fragment are removed from paths before \
             matching, so it would never match"
        ));
    }
    if text.contains(';') {
        return Some(format!(
            "{text:?} has `;`: `;` parameters are removed from paths before matching \
             (`/login;x=1` is `/login`), so it would never match"
        ));
    }
    if text.contains("//") {
        return Some(format!(
            "{text:?} has `//`: repeated slashes are merged in paths before matching"
        ));
    }
    if text.len() > 1 && text.ends_with('/') {
        let bare = text.trim_end_matches('/');
        return Some(format!(
            "{text:?} ends with `/`: a trailing slash is removed from paths before matching; \
             write {bare:?}"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A path as matched is its own canonical form, and a `path` value accepted in a
        /// condition is already one: what is written is what is compared.
        #[test]
        fn canonical_paths_are_fixed_points(path in "[aB/;?#=]{0,12}") {
            let once = canonical_path(&path).into_owned();
            prop_assert_eq!(canonical_path(&once), once.as_str());
            if path_pattern_problem(&path).is_none() {
                prop_assert_eq!(canonical_path(&path), path.as_str());
            }
        }
    }

    #[test]
    fn paths_lose_parameters_and_extra_slashes() {
        for (sent, matched) in [
            ("/login", "/login"),
            ("/login/", "/login"),
            ("/login;jsessionid=1", "/login"),
            ("/login;a=1/", "/login"),
            ("//login//", "/login"),
            ("/a;x/b;y", "/a/b"),
            ("/", "/"),
            ("/;x", "/"),
            ("", ""),
            ("rel/x/", "rel/x"),
            ("/login?next=/home", "/login"),
            ("/login/#top", "/login"),
            ("/?q", "/"),
        ] {
            assert_eq!(canonical_path(sent), matched, "{sent}");
        }
        assert!(matches!(canonical_path("/v1/x"), Cow::Borrowed(_)));
    }

    #[test]
    fn the_path_is_compared_folded_and_kept_as_sent() {
        let descriptors: Descriptors = [
            ("path".to_owned(), "/Orders/AbC/;v=2".to_owned()),
            ("ip".to_owned(), "X".to_owned()),
        ]
        .into();
        let subject = Subject::new(&descriptors);
        assert_eq!(
            subject.value("path", PathCase::Insensitive),
            Some(("/orders/abc", "/Orders/AbC"))
        );
        assert_eq!(
            subject.value("path", PathCase::Exact),
            Some(("/Orders/AbC", "/Orders/AbC"))
        );
        assert_eq!(subject.value("ip", PathCase::Insensitive), Some(("X", "X")));
        assert_eq!(subject.value("tenant", PathCase::Exact), None);
    }

    #[test]
    fn path_patterns_that_could_never_match_are_named() {
        for bad in ["/login;x", "//login", "/login/", "/v1/*/", "/login?x=*"] {
            assert!(path_pattern_problem(bad).is_some(), "{bad}");
        }
        for good in ["/", "/login", "*", "/v1/*", "/Login"] {
            assert_eq!(path_pattern_problem(good), None, "{good}");
        }
    }
}
