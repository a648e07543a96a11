//! A `RateLimitRequest` turned into the check service's question: one group item per
//! descriptor, its entries as descriptors plus the pseudo-descriptors that select converted
//! envoyproxy/ratelimit limits and domain policies (a repeated key named by its occurrence, an
//! empty value as [`EMPTY_VALUE`], a limit override marked by [`OVERRIDE_DESCRIPTOR`]).
//! Malformed requests are refused with a reason.

use crate::check::{CheckRequest, GroupItem, Spend};
use crate::config::envoy::{
    entry_name, DOMAIN_DESCRIPTOR, EMPTY_VALUE, ENTRIES_DESCRIPTOR, OVERRIDE_DESCRIPTOR,
};
use crate::config::RequestLimits;
use crate::limit::{Algorithm, Descriptors, FixedWindow};

use super::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use super::proto::envoy::r#type::v3::RateLimitUnit;
use super::proto::envoy::service::ratelimit::v3::RateLimitRequest;

/// Largest `requests_per_unit` of a limit override (the policy file's own bound on limits).
const MAX_OVERRIDE: u64 = 1_000_000_000;

/// The group to check for `request`, or why it cannot be checked.
pub(super) fn items(
    request: &RateLimitRequest,
    limits: &RequestLimits,
) -> Result<Vec<GroupItem>, String> {
    if request.domain.is_empty() {
        return Err("domain is required".into());
    }
    if request.domain.len() > limits.max_value_bytes {
        return Err(format!(
            "domain must be at most {} bytes",
            limits.max_value_bytes
        ));
    }
    if request.descriptors.is_empty() {
        return Err("at least one descriptor is required".into());
    }
    if request.descriptors.len() > limits.max_batch {
        return Err(format!(
            "at most {} descriptors, got {}",
            limits.max_batch,
            request.descriptors.len()
        ));
    }
    let request_hits = match request.hits_addend {
        0 => 1,
        hits => u64::from(hits),
    };
    request
        .descriptors
        .iter()
        .enumerate()
        .map(|(index, descriptor)| {
            let here = |reason: String| format!("descriptors[{index}]: {reason}");
            if descriptor.entries.is_empty() {
                return Err(here("at least one entry is required".into()));
            }
            // Bounded before the entries are read (the occurrence count is quadratic).
            if descriptor.entries.len() > limits.max_descriptors {
                return Err(here(format!(
                    "at most {} entries, got {}",
                    limits.max_descriptors,
                    descriptor.entries.len()
                )));
            }
            let mut descriptors = Descriptors::new();
            let mut keys = String::new();
            for (at, entry) in descriptor.entries.iter().enumerate() {
                if entry.key.starts_with("rls.") {
                    return Err(here(format!("entry key `{}` is reserved", entry.key)));
                }
                // A key repeated in one descriptor is named by its occurrence, as the
                // converted envoyproxy/ratelimit limits name it.
                let occurrence = descriptor.entries[..=at]
                    .iter()
                    .filter(|e| e.key == entry.key)
                    .count();
                // An empty value matches the value-less key only, as upstream's does.
                let value = if entry.value.is_empty() {
                    EMPTY_VALUE.to_owned()
                } else {
                    entry.value.clone()
                };
                descriptors.insert(entry_name(&entry.key, occurrence).into_owned(), value);
                if !keys.is_empty() {
                    keys.push(',');
                }
                keys.push_str(&entry.key);
            }
            descriptors.insert(DOMAIN_DESCRIPTOR.into(), request.domain.clone());
            descriptors.insert(ENTRIES_DESCRIPTOR.into(), keys);
            let hits = descriptor.hits_addend.unwrap_or(request_hits);
            let quota_override = descriptor
                .limit
                .as_ref()
                .map(quota)
                .transpose()
                .map_err(here)?;
            if quota_override.is_some() {
                descriptors.insert(OVERRIDE_DESCRIPTOR.into(), "1".into());
            }
            Ok(GroupItem {
                request: CheckRequest {
                    policy: None,
                    descriptors,
                    // 0 checks without spending: would one more unit pass?
                    cost: hits.max(1),
                    spend: Spend::from_dry_run(hits == 0),
                },
                quota_override,
            })
        })
        .collect()
}

/// The quota of a limit override: a fixed window of one unit, like envoyproxy/ratelimit's.
fn quota(limit: &RateLimitOverride) -> Result<Algorithm, String> {
    let second = 1_000_000;
    let day = 86_400 * second;
    let unit_us = match RateLimitUnit::try_from(limit.unit) {
        Ok(RateLimitUnit::Second) => second,
        Ok(RateLimitUnit::Minute) => 60 * second,
        Ok(RateLimitUnit::Hour) => 3_600 * second,
        Ok(RateLimitUnit::Day) => day,
        Ok(RateLimitUnit::Week) => 7 * day,
        Ok(RateLimitUnit::Month) => 30 * day,
        Ok(RateLimitUnit::Year) => 365 * day,
        Ok(RateLimitUnit::Unknown) | Err(_) => {
            return Err(format!("limit override has no known unit ({})", limit.unit))
        }
    };
    let requests = u64::from(limit.requests_per_unit);
    if requests == 0 || requests > MAX_OVERRIDE {
        return Err(format!(
            "limit override must be 1 to {MAX_OVERRIDE} requests per unit, got {requests}"
        ));
    }
    FixedWindow::new(requests, unit_us)
        .map(Algorithm::from)
        .map_err(|e| format!("limit override: {e}"))
}
