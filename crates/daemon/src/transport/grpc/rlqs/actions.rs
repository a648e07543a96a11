//! The actions sent for a bucket: its id rebuilt from the descriptors it is kept by, an
//! assignment of a strategy for a time to live, and a blanket rule for a bucket not kept.

use std::collections::BTreeMap;

use super::metrics::Kind;
use super::Quota;
use crate::transport::grpc::proto::envoy::r#type::v3::{
    rate_limit_strategy::{BlanketRule, Strategy},
    RateLimitStrategy,
};
use crate::transport::grpc::proto::envoy::service::rate_limit_quota::v3::{
    rate_limit_quota_response::{
        bucket_action::{BucketAction as Action, QuotaAssignmentAction},
        BucketAction,
    },
    BucketId,
};

/// The id Envoy named a bucket by, rebuilt from its descriptors.
pub(super) fn bucket_id(name: &BTreeMap<String, String>) -> BucketId {
    BucketId {
        bucket: name.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    }
}

/// An assignment of `strategy` for `ttl_s` to the bucket `name`.
pub(super) fn assignment(
    name: &BTreeMap<String, String>,
    strategy: Strategy,
    ttl_s: u64,
) -> BucketAction {
    BucketAction {
        bucket_id: Some(bucket_id(name)),
        bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(prost_types::Duration {
                seconds: i64::try_from(ttl_s).unwrap_or(i64::MAX),
                nanos: 0,
            }),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy),
            }),
        })),
    }
}

/// A blanket rule (`ALLOW_ALL` or `DENY_ALL`) for `ttl_s`, counted, for a bucket not kept.
pub(super) fn blanket_once(
    quota: &Quota,
    name: &BTreeMap<String, String>,
    allow: bool,
    ttl_s: u64,
) -> BucketAction {
    let (rule, kind) = if allow {
        (BlanketRule::AllowAll, Kind::AllowAll)
    } else {
        (BlanketRule::DenyAll, Kind::DenyAll)
    };
    quota.metrics.assigned(kind);
    assignment(name, Strategy::BlanketRule(rule as i32), ttl_s)
}
