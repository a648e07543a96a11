//! Envoy's rate limit quota filter configuration read for `sluice config check --rlqs`: which
//! buckets its `bucket_matchers` build, and which policies each bucket selects over RLQS (the
//! session plans a bucket's id as a check's descriptors plus `rls.domain`). A bucket that selects
//! no policy is allowed everything by the daemon (`ALLOW_ALL`, counted and logged): here it is an
//! error with the file's line, as every other problem of `config check`.
//!
//! The file may be a whole bootstrap, a listener, or just the `http_filters` list: every
//! mapping whose `@type` is `RateLimitQuotaFilterConfig` is a filter, and every mapping under
//! its `bucket_matchers` with a `bucket_id_builder` is a bucket's settings (`on_no_match`, each
//! matcher's `on_match`, nested matchers alike). A value built from the request
//! (`custom_value`) is not known here: it stands for any value, so a policy that matches only
//! some values of it is reported as matching depending on the request.
//!
//! Lines come from the text's layout, as for policy files: the n-th settings is the n-th
//! `bucket_id_builder:` key that is not directly inside another; when the layout does not show
//! them one per line, no line is given rather than a wrong one.

use serde_yaml::Value;

use crate::config::envoy::DOMAIN_DESCRIPTOR;
use crate::limit::{Descriptors, PolicySet};

/// The `@type` suffixes that mark the filter and a bucket's settings.
const FILTER_TYPE: &str = "RateLimitQuotaFilterConfig";
const SETTINGS_TYPE: &str = "RateLimitQuotaBucketSettings";

/// One value of a bucket's id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BucketValue {
    /// `string_value`: the same for every request.
    Fixed(String),
    /// `custom_value`: taken from the request (what it names: a header, ...).
    FromRequest(String),
}

/// One bucket's settings as the filter builds it.
#[derive(Clone, Debug)]
pub struct RlqsBucket {
    /// The filter's `domain`.
    pub domain: String,
    /// The bucket id's entries.
    pub entries: Vec<(String, BucketValue)>,
    /// 1-based line of its `bucket_id_builder`, when the layout shows it.
    pub line: Option<usize>,
}

/// What the policies in force make of one bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BucketVerdict {
    /// These policies apply to it (after `replaces`), whatever the request's values.
    Matches(Vec<String>),
    /// No policy applies for some values; these policies only for some values of the named
    /// entries built from the request.
    Depends(Vec<String>),
    /// No policy applies, whatever the request: `ALLOW_ALL` over RLQS.
    Unmatched,
    /// The id is refused by the daemon (`DENY_ALL`, `reason="invalid"`).
    Invalid(String),
}

/// The buckets of every rate limit quota filter in `text` (YAML).
pub fn rlqs_buckets(text: &str) -> Result<Vec<RlqsBucket>, String> {
    let doc: Value = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
    let mut buckets = Vec::new();
    let mut filters = 0;
    find_filters(&doc, &mut |filter| {
        filters += 1;
        let domain = filter
            .get("domain")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if let Some(matchers) = filter.get("bucket_matchers") {
            find_settings(matchers, &mut |settings| {
                buckets.push(RlqsBucket {
                    domain: domain.clone(),
                    entries: entries(settings),
                    line: None,
                })
            });
        }
    });
    if filters == 0 {
        return Err(format!(
            "no rate limit quota filter (`@type` ...{FILTER_TYPE}) in the file"
        ));
    }
    let lines = settings_lines(text);
    if lines.len() == buckets.len() {
        for (bucket, line) in buckets.iter_mut().zip(lines) {
            bucket.line = Some(line);
        }
    }
    Ok(buckets)
}

fn type_is(value: &Value, suffix: &str) -> bool {
    value
        .get("@type")
        .and_then(Value::as_str)
        .is_some_and(|t| t.ends_with(suffix))
}

/// Calls `found` with every filter config under `value`, in document order.
fn find_filters(value: &Value, found: &mut impl FnMut(&Value)) {
    match value {
        Value::Mapping(_) if type_is(value, FILTER_TYPE) => found(value),
        Value::Mapping(map) => map.values().for_each(|v| find_filters(v, found)),
        Value::Sequence(items) => items.iter().for_each(|v| find_filters(v, found)),
        Value::Tagged(tagged) => find_filters(&tagged.value, found),
        _ => {}
    }
}

/// Calls `found` with every bucket settings under `value`, in document order.
fn find_settings(value: &Value, found: &mut impl FnMut(&Value)) {
    match value {
        Value::Mapping(_) if type_is(value, SETTINGS_TYPE) || is_settings(value) => found(value),
        Value::Mapping(map) => map.values().for_each(|v| find_settings(v, found)),
        Value::Sequence(items) => items.iter().for_each(|v| find_settings(v, found)),
        Value::Tagged(tagged) => find_settings(&tagged.value, found),
        _ => {}
    }
}

fn is_settings(value: &Value) -> bool {
    value
        .get("bucket_id_builder")
        .is_some_and(|b| b.get("bucket_id_builder").is_some())
}

fn entries(settings: &Value) -> Vec<(String, BucketValue)> {
    let Some(Value::Mapping(map)) = settings
        .get("bucket_id_builder")
        .and_then(|b| b.get("bucket_id_builder"))
    else {
        return Vec::new();
    };
    map.iter()
        .filter_map(|(key, builder)| {
            let key = key.as_str()?.to_owned();
            let value = match builder.get("string_value").and_then(Value::as_str) {
                Some(fixed) => BucketValue::Fixed(fixed.to_owned()),
                None => {
                    let custom = builder.get("custom_value");
                    let from = custom
                        .and_then(|c| c.get("typed_config"))
                        .and_then(|t| t.get("header_name"))
                        .and_then(Value::as_str)
                        .map(|h| format!("header {h}"))
                        .or_else(|| {
                            custom
                                .and_then(|c| c.get("name"))
                                .and_then(Value::as_str)
                                .map(str::to_owned)
                        })
                        .unwrap_or_else(|| "the request".to_owned());
                    BucketValue::FromRequest(from)
                }
            };
            Some((key, value))
        })
        .collect()
}

/// 1-based lines of the settings' outer `bucket_id_builder:` keys (an inner one directly below
/// an outer one, deeper, is the same settings).
fn settings_lines(text: &str) -> Vec<usize> {
    let mut lines = Vec::new();
    let mut last: Option<(usize, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if !trimmed.starts_with("bucket_id_builder:") {
            continue;
        }
        let depth = line.len() - trimmed.len();
        match last {
            Some((at, outer)) if at + 1 == i && depth > outer => {}
            _ => lines.push(i + 1),
        }
        last = Some((i, depth));
    }
    lines
}

/// A request value no policy file names: stands for any value of an entry built from the
/// request.
const ANY: &str = "\u{1}any";

/// What `policies` make of `bucket` (see [`BucketVerdict`]).
pub fn verdict(policies: &PolicySet, bucket: &RlqsBucket) -> BucketVerdict {
    if let Some((key, _)) = bucket.entries.iter().find(|(k, _)| k.starts_with("rls.")) {
        return BucketVerdict::Invalid(format!("its key `{key}` starts with `rls.`"));
    }
    if bucket.entries.is_empty() {
        return BucketVerdict::Invalid("its bucket_id_builder builds no entry".into());
    }
    let mut descriptors = Descriptors::new();
    for (key, value) in &bucket.entries {
        let value = match value {
            BucketValue::Fixed(fixed) => fixed.clone(),
            BucketValue::FromRequest(_) => ANY.to_owned(),
        };
        descriptors.insert(key.clone(), value);
    }
    if !bucket.domain.is_empty() {
        descriptors.insert(DOMAIN_DESCRIPTOR.into(), bucket.domain.clone());
    }
    let mut lists = vec![policies.matching(&descriptors)];
    policies.drop_replaced(&mut lists);
    let names: Vec<String> = lists[0]
        .iter()
        .map(|a| a.policy.name().to_owned())
        .collect();
    if !names.is_empty() {
        return BucketVerdict::Matches(names);
    }
    // A policy held back only by a condition on an entry built from the request may apply
    // to some requests.
    let depends: Vec<String> = policies
        .iter()
        .filter(|p| {
            p.unmet_condition(&descriptors)
                .is_some_and(|(name, _, sent)| {
                    sent && bucket.entries.iter().any(|(key, value)| {
                        key == name && matches!(value, BucketValue::FromRequest(_))
                    })
                })
        })
        .map(|p| p.name().to_owned())
        .collect();
    if depends.is_empty() {
        BucketVerdict::Unmatched
    } else {
        BucketVerdict::Depends(depends)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILTER: &str = "\
http_filters:
  - name: envoy.filters.http.rate_limit_quota
    typed_config:
      \"@type\": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
      domain: edge
      bucket_matchers:
        matcher_list:
          matchers:
            - on_match:
                action:
                  typed_config:
                    \"@type\": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                    bucket_id_builder:
                      bucket_id_builder:
                        bucket: { string_value: public_api }
        on_no_match:
          action:
            typed_config:
              bucket_id_builder:
                bucket_id_builder:
                  ip:
                    custom_value:
                      name: ip
                      typed_config: { header_name: x-real-ip }
";

    #[test]
    fn every_bucket_of_every_matcher_with_its_line() {
        let buckets = rlqs_buckets(FILTER).unwrap();
        assert_eq!(buckets.len(), 2, "{buckets:?}");
        assert_eq!(buckets[0].domain, "edge");
        assert_eq!(
            buckets[0].entries,
            vec![("bucket".into(), BucketValue::Fixed("public_api".into()))]
        );
        assert_eq!(buckets[0].line, Some(13));
        assert_eq!(
            buckets[1].entries,
            vec![(
                "ip".into(),
                BucketValue::FromRequest("header x-real-ip".into())
            )]
        );
        assert_eq!(buckets[1].line, Some(19));
    }

    #[test]
    fn a_bucket_matches_depends_or_matches_nothing() {
        let policies = crate::config::parse_policies(
            std::path::Path::new("p.yaml"),
            "policies:\n  - {name: per_ip, key: [ip], algorithm: fixed_window, limit: 5, period: 1m}\n  - {name: gold, match: {tier: gold}, key: [user], algorithm: fixed_window, limit: 5, period: 1m}\n",
        )
        .unwrap();
        let bucket = |entries: Vec<(&str, BucketValue)>| RlqsBucket {
            domain: "edge".into(),
            entries: entries
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
            line: None,
        };
        let header = |h: &str| BucketValue::FromRequest(format!("header {h}"));
        assert_eq!(
            verdict(&policies, &bucket(vec![("ip", header("x-real-ip"))])),
            BucketVerdict::Matches(vec!["per_ip".into()])
        );
        assert_eq!(
            verdict(
                &policies,
                &bucket(vec![("user", header("x-user")), ("tier", header("x-tier"))])
            ),
            BucketVerdict::Depends(vec!["gold".into()])
        );
        assert_eq!(
            verdict(
                &policies,
                &bucket(vec![("bucket", BucketValue::Fixed("public_api".into()))])
            ),
            BucketVerdict::Unmatched
        );
        assert!(matches!(
            verdict(&policies, &bucket(vec![("rls.x", header("x"))])),
            BucketVerdict::Invalid(_)
        ));
    }

    #[test]
    fn a_file_without_the_filter_is_an_error() {
        let err = rlqs_buckets("http_filters: []\n").unwrap_err();
        assert!(err.contains("RateLimitQuotaFilterConfig"), "{err}");
    }
}
