//! What a check asks and how a malformed question is refused (4xx, nothing spent).

use crate::config::RequestLimits;
use crate::limit::Descriptors;
pub use crate::limit::MAX_DESCRIPTOR_NAME;
pub use crate::store::Spend;

/// One request's question: may it go through?
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckRequest {
    /// Check only this policy (its `match` conditions are not required to hold).
    pub policy: Option<String>,
    /// The request's attributes.
    pub descriptors: Descriptors,
    /// Units to spend (a GraphQL query's complexity, LLM tokens); usually 1. A policy's cost
    /// table, when it lists the request's value, sets the cost instead.
    pub cost: u64,
    /// Whether the allowed cost is spent ([`Spend::DryRun`]: evaluate without spending anything;
    /// the wire's `dry_run`).
    pub spend: Spend,
}

/// The request is malformed or cannot be checked as asked: a 4xx, nothing was spent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    /// The request breaks a cap or a syntax rule.
    #[error("{0}")]
    Invalid(String),
    /// The named policy does not exist.
    #[error("unknown policy `{0}`")]
    UnknownPolicy(String),
    /// The named policy needs a descriptor the request lacks.
    #[error("policy `{policy}` needs descriptor `{descriptor}`")]
    MissingDescriptor {
        /// The policy.
        policy: String,
        /// The descriptor it keys on.
        descriptor: String,
    },
    /// A batch item failed: the reason names the item, the inner error says what failed.
    #[error("{0}")]
    Batch(String, Box<CheckError>),
    /// No amount of waiting would admit this cost.
    #[error("cost {cost} exceeds the most policy `{policy}` can ever allow at once ({limit})")]
    CostExceedsLimit {
        /// The policy.
        policy: String,
        /// The requested cost.
        cost: u64,
        /// What the policy allows at most.
        limit: u64,
    },
    /// A report applies to a policy that refuses reports (`reports: false`): nothing spent.
    #[error(
        "policy `{0}` does not accept reports (reports: false): its counter moves by checks only"
    )]
    ReportsRefused(String),
    /// A reservation applies to a policy that takes none (no `reservations: true`): nothing
    /// spent.
    #[error(
        "policy `{0}` takes no reservations (reservations: true): check with a cost, or report \
         it after the fact"
    )]
    ReservationsRefused(String),
}

impl CheckError {
    /// The same error, its reason prefixed with the batch item it concerns.
    pub(crate) fn in_batch(self, index: usize) -> Self {
        let at = |reason: String| format!("checks[{index}]: {reason}");
        match self {
            Self::Invalid(reason) => Self::Invalid(at(reason)),
            other => Self::Batch(at(other.to_string()), Box::new(other)),
        }
    }
}

/// Checks the request against the caps and the descriptor syntax.
pub(crate) fn validate(limits: &RequestLimits, request: &CheckRequest) -> Result<(), CheckError> {
    let invalid = |reason: String| Err(CheckError::Invalid(reason));
    if request.cost == 0 || request.cost > limits.max_cost {
        return invalid(format!(
            "cost must be 1 to {}, got {}",
            limits.max_cost, request.cost
        ));
    }
    if request.descriptors.len() > limits.max_descriptors {
        return invalid(format!(
            "at most {} descriptors, got {}",
            limits.max_descriptors,
            request.descriptors.len()
        ));
    }
    for (name, value) in &request.descriptors {
        let name_ok = !name.is_empty()
            && name.len() <= MAX_DESCRIPTOR_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !name_ok {
            return invalid(format!(
                "descriptor name {name:?} must be 1 to {MAX_DESCRIPTOR_NAME} characters of a-z, A-Z, 0-9, `_`, `-`, `.`"
            ));
        }
        if value.is_empty() || value.len() > limits.max_value_bytes {
            return invalid(format!(
                "descriptor `{name}` must be 1 to {} bytes, got {}",
                limits.max_value_bytes,
                value.len()
            ));
        }
    }
    Ok(())
}
