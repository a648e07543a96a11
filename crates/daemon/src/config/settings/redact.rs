//! Credentials out of URLs before they are shown anywhere (logs, errors, `config check`): every
//! form redis-rs accepts a password in, namely `user:password@` in the authority (TCP and TLS
//! URLs) and the `pass` / `password` query fields (`redis+unix://` and `unix://` URLs). User
//! names stay visible in both forms, since they identify without granting; a lone userinfo
//! without a `:` is masked whole, as some clients read it as a password.

/// What replaces a secret.
const MASK: &str = "***";

/// `url` with every password replaced by `***`.
pub fn mask_url(url: &str) -> String {
    let (before_query, query) = match url.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (url, None),
    };
    let mut out = String::with_capacity(url.len());
    match before_query.find("://").map(|i| i + 3) {
        None => out.push_str(before_query),
        Some(scheme_end) => {
            out.push_str(&before_query[..scheme_end]);
            let rest = &before_query[scheme_end..];
            let authority_end = rest.find(['/', '#']).unwrap_or(rest.len());
            let (authority, path) = rest.split_at(authority_end);
            match authority.rfind('@') {
                None => out.push_str(authority),
                Some(at) => {
                    match authority[..at].split_once(':') {
                        Some((user, _)) => {
                            out.push_str(user);
                            out.push(':');
                            out.push_str(MASK);
                        }
                        None => out.push_str(MASK),
                    }
                    out.push_str(&authority[at..]);
                }
            }
            out.push_str(path);
        }
    }
    if let Some(query) = query {
        out.push('?');
        for (i, pair) in query.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            match pair.split_once('=') {
                Some((key, _)) if is_secret(key) => {
                    out.push_str(key);
                    out.push('=');
                    out.push_str(MASK);
                }
                _ => out.push_str(pair),
            }
        }
    }
    out
}

fn is_secret(key: &str) -> bool {
    ["pass", "password"]
        .iter()
        .any(|secret| key.eq_ignore_ascii_case(secret))
}

#[cfg(test)]
mod tests {
    use super::mask_url;

    #[test]
    fn every_password_form_is_masked() {
        for (url, shown) in [
            ("redis://:s3cret@h:6379/0", "redis://:***@h:6379/0"),
            ("rediss://app:s3cret@h", "rediss://app:***@h"),
            ("redis://s3cret@h", "redis://***@h"),
            ("redis://h:6379", "redis://h:6379"),
            (
                "redis://a:p@ss@h/1?protocol=resp3",
                "redis://a:***@h/1?protocol=resp3",
            ),
            (
                "redis+unix:///run/redis.sock?db=1&pass=s3cret",
                "redis+unix:///run/redis.sock?db=1&pass=***",
            ),
            (
                "unix:///run/redis.sock?user=app&password=s3cret",
                "unix:///run/redis.sock?user=app&password=***",
            ),
            (
                "unix:///run/redis.sock?PASS=s3cret",
                "unix:///run/redis.sock?PASS=***",
            ),
            ("/run/redis.sock", "/run/redis.sock"),
        ] {
            assert_eq!(mask_url(url), shown, "{url}");
            assert!(!mask_url(url).contains("s3cret"));
        }
    }
}
