//! The original request's path as the application behind a proxy sees it, for matching policies
//! in `/v1/authz`: `//login`, `/./login`, `/%6Cogin` and `/login/` are all the login page to the
//! application, so they must all be `/login` to sluice.
//!
//! The rules are nginx's own URI normalisation (`merge_slashes on`, the default): the query and
//! fragment are dropped, `%XX` escapes are decoded (`%2F` included), runs of `/` are merged, `.`
//! segments are dropped and `..` removes the segment before it (above the root is an error, as
//! nginx answers 400). On top of nginx: a trailing slash is dropped (most frameworks route
//! `/login/` to `/login`). Letters are kept: case and `;` parameters are the matcher's business
//! ([`crate::limit::Subject`]), the same for every transport.

/// Normalises `uri` (a request target such as `/a//b/../c?x=1`); `Err` says why it is invalid.
pub fn normalize(uri: &str) -> Result<String, String> {
    let raw = uri.split(['?', '#']).next().unwrap_or("");
    let decoded = percent_decode(raw)?;
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                if segments.pop().is_none() {
                    return Err(format!("path {uri:?} climbs above the root"));
                }
            }
            other => segments.push(other),
        }
    }
    let mut path = String::with_capacity(decoded.len() + 1);
    for segment in &segments {
        path.push('/');
        path.push_str(segment);
    }
    if path.is_empty() {
        path.push('/');
    }
    Ok(path)
}

fn percent_decode(text: &str) -> Result<String, String> {
    if !text.contains('%') {
        return check_controls(text.to_owned());
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("path {text:?} has a bad %-escape"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let decoded =
        String::from_utf8(out).map_err(|_| format!("path {text:?} does not decode to UTF-8"))?;
    check_controls(decoded)
}

fn check_controls(text: String) -> Result<String, String> {
    if text.bytes().any(|b| b.is_ascii_control()) {
        return Err(format!("path {text:?} contains control characters"));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn variants_of_one_path_are_one_path() {
        for variant in [
            "/login",
            "//login",
            "/login/",
            "/./login",
            "/x/../login",
            "/%6Cogin",
            "/login?next=/home",
            "/login#top",
            "///login//",
        ] {
            assert_eq!(normalize(variant).as_deref(), Ok("/login"), "{variant}");
        }
        assert_eq!(
            normalize("/LOGIN/").as_deref(),
            Ok("/LOGIN"),
            "case is the matcher's"
        );
        assert_eq!(normalize("").as_deref(), Ok("/"));
        assert_eq!(normalize("/?q").as_deref(), Ok("/"));
        assert_eq!(normalize("/v1/orders%2F42").as_deref(), Ok("/v1/orders/42"));
    }

    #[test]
    fn invalid_paths_are_errors() {
        for bad in ["/../etc", "/%zz", "/%", "/%00", "/%ff%fe"] {
            assert!(normalize(bad).is_err(), "{bad}");
        }
    }
}
