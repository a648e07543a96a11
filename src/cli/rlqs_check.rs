//! `sluice config check POLICIES --rlqs ENVOY_YAML`: which policies each bucket of Envoy's rate
//! limit quota filter selects over RLQS. A bucket that selects none is allowed everything by
//! the daemon; here it is an error with the Envoy file's line (exit 64).

use std::path::Path;
use std::process::ExitCode;

use sluice::config::envoy::rlqs_filter::{rlqs_buckets, verdict, BucketValue, BucketVerdict};
use sluice::config::{bounded_read, FileLimits};
use sluice::limit::PolicySet;

use super::EXIT_CONFIG;

/// Reads `envoy`, prints each bucket's policies, fails on a bucket with none.
pub fn run(policies: &PolicySet, envoy: &Path, limits: &FileLimits) -> ExitCode {
    let text = match bounded_read::read(envoy, limits) {
        Ok((text, _)) => text,
        Err(error) => {
            return super::fail(EXIT_CONFIG, format_args!("{}: {error}", envoy.display()))
        }
    };
    let buckets = match rlqs_buckets(&text) {
        Ok(buckets) => buckets,
        Err(error) => {
            return super::fail(EXIT_CONFIG, format_args!("{}: {error}", envoy.display()))
        }
    };
    let mut failed = false;
    for bucket in &buckets {
        let at = match bucket.line {
            Some(line) => format!("{}:{line}", envoy.display()),
            None => envoy.display().to_string(),
        };
        let id: Vec<String> = bucket
            .entries
            .iter()
            .map(|(key, value)| match value {
                BucketValue::Fixed(fixed) => format!("{key}={fixed}"),
                BucketValue::FromRequest(from) => format!("{key}=<{from}>"),
            })
            .collect();
        let id = format!("bucket {{{}}} (domain {})", id.join(", "), bucket.domain);
        match verdict(policies, bucket) {
            BucketVerdict::Matches(names) => {
                let over = if names.len() > 1 {
                    " (several policies: DENY_ALL over RLQS, use ShouldRateLimit)"
                } else {
                    ""
                };
                println!("{at}: {id}: policy {}{over}", names.join(", "));
            }
            BucketVerdict::Depends(names) => println!(
                "{at}: {id}: policy {} for some values of the request's entries, none for the \
                 others (ALLOW_ALL)",
                names.join(", ")
            ),
            BucketVerdict::Unmatched => {
                failed = true;
                eprintln!(
                    "{at}: {id} matches no policy: the daemon would allow it everything \
                     (ALLOW_ALL); name a policy's key descriptors in its bucket_id_builder"
                );
            }
            BucketVerdict::Invalid(why) => {
                failed = true;
                eprintln!("{at}: {id} is refused by the daemon (DENY_ALL): {why}");
            }
        }
    }
    if buckets.is_empty() {
        return super::fail(
            EXIT_CONFIG,
            format_args!("{}: the filter builds no bucket", envoy.display()),
        );
    }
    if failed {
        ExitCode::from(EXIT_CONFIG)
    } else {
        println!("{}: ok, {} bucket(s)", envoy.display(), buckets.len());
        ExitCode::SUCCESS
    }
}
