//! Per-policy decisions, the overall verdict, and how the deciding policy is chosen.

use std::sync::Arc;

use crate::limit::{Decision, Key, Micros, Policy};

/// How a policy's decision was reached. Serialised as its name ([`Mode::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// By the store, and it counts.
    Enforced,
    /// By the store, but only reported: a shadow policy (or a partition outside its rollout
    /// percentage) never blocks.
    Shadow,
    /// The store could not answer; the policy fails open.
    FailOpen,
    /// The store could not answer; decided by this pod's local share.
    Local,
    /// The store could not answer; the policy fails closed (503).
    FailClosed,
    /// Denied by the policy's `local_limit` in this pod; the store was not asked.
    LocalLimit,
}

impl Mode {
    /// Whether the answer's figures were counted somewhere (the store, this pod's share, the
    /// local limit): false for `fail_open` and `fail_closed`, whose store was not reached, so
    /// they have no `remaining` to tell.
    pub fn counted(self) -> bool {
        !matches!(self, Self::FailOpen | Self::FailClosed)
    }

    /// Every mode.
    pub const ALL: [Self; 6] = [
        Self::Enforced,
        Self::Shadow,
        Self::FailOpen,
        Self::Local,
        Self::FailClosed,
        Self::LocalLimit,
    ];

    /// The name used in answers, logs and spans.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enforced => "enforced",
            Self::Shadow => "shadow",
            Self::FailOpen => "fail_open",
            Self::Local => "local",
            Self::FailClosed => "fail_closed",
            Self::LocalLimit => "local_limit",
        }
    }
}

/// The overall answer. Serialised as its name ([`Outcome::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Go ahead (200).
    Allowed,
    /// Over the limit (429).
    Denied,
    /// A fail-closed policy could not be checked (503).
    Unavailable,
}

impl Outcome {
    /// The name used in answers and spans.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::Unavailable => "unavailable",
        }
    }
}

/// Serialises each of these types as its `as_str` name, so each has one list of names.
macro_rules! serialize_as_name {
    ($($name:ty),+) => {$(
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }
    )+};
}

serialize_as_name!(Mode, Outcome);

/// One policy's part in a verdict.
#[derive(Debug, Clone)]
pub struct PolicyDecision {
    /// The policy.
    pub policy: Arc<Policy>,
    /// The counter it spent from.
    pub key: Key,
    /// Its decision (for fail-closed policies that could not be checked: a denial with no retry).
    pub decision: Decision,
    /// How it was reached.
    pub mode: Mode,
    /// The advertised length in which `limit` units fit, for `RateLimit-Policy` (the period; for
    /// a token bucket the time to refill from empty, so `limit` per length is exactly the refill
    /// rate). See [`Algorithm::advertised_us`](crate::limit::Algorithm::advertised_us).
    pub advertised_us: Micros,
    /// Which window of the policy's quota this is (its index in `limits`), for a policy of
    /// several windows; `None` for a policy of one (and for its local limit).
    pub window_index: Option<usize>,
    /// Its part's index in the plan it was decided from ([`Plan`](super::Plan)).
    pub part: usize,
}

/// The answer to a check.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// The overall answer.
    pub outcome: Outcome,
    /// Which of `evaluated` decided (see [`Verdict::deciding`]); `None` when no policy applied.
    pub deciding_index: Option<usize>,
    /// Every policy evaluated, in policy-file order; a policy of several windows has one entry
    /// per window, next to each other.
    pub evaluated: Vec<PolicyDecision>,
    /// The token of the concurrency permits an allowed request holds (`POST /v1/release` gives
    /// them back); `None` when it holds none.
    pub permit: Option<String>,
    /// The token of the reservation an allowed `"reserve": true` check made (`POST
    /// /v1/settle` settles it); `None` otherwise.
    pub reservation: Option<String>,
}

impl Verdict {
    /// The verdict when no policy applies.
    pub fn unlimited() -> Self {
        Self {
            outcome: Outcome::Allowed,
            deciding_index: None,
            evaluated: Vec::new(),
            permit: None,
            reservation: None,
        }
    }

    /// The policy whose figures the client should see: the denying one with the longest wait,
    /// else the enforced one with the least remaining. `None` when no policy applied.
    pub fn deciding(&self) -> Option<&PolicyDecision> {
        self.evaluated.get(self.deciding_index?)
    }
}

/// One entry per policy of `evaluated` (whose windows sit next to each other): the window that
/// decides for that policy (as [`decide`] picks among all).
pub fn per_policy(evaluated: &[PolicyDecision]) -> impl Iterator<Item = &PolicyDecision> {
    evaluated
        .chunk_by(|a, b| Arc::ptr_eq(&a.policy, &b.policy))
        .map(|windows| match windows {
            [only] => only,
            windows => {
                let denied = windows
                    .iter()
                    .filter(|p| !p.decision.allowed)
                    .max_by_key(|p| p.decision.retry_after_us);
                denied
                    .or_else(|| windows.iter().min_by_key(|p| p.decision.remaining))
                    .unwrap_or(&windows[0])
            }
        })
}

/// Combines per-policy decisions: any enforced denial denies (the longest wait decides), else any
/// fail-closed policy makes the answer unavailable, else the tightest enforced policy decides.
pub fn decide(evaluated: Vec<PolicyDecision>) -> Verdict {
    let enforced = || {
        evaluated
            .iter()
            .enumerate()
            .filter(|(_, p)| p.mode != Mode::Shadow)
    };
    let denied = enforced()
        .filter(|(_, p)| !p.decision.allowed && p.mode != Mode::FailClosed)
        .max_by_key(|(_, p)| p.decision.retry_after_us);
    let unavailable = enforced().find(|(_, p)| p.mode == Mode::FailClosed);
    let (outcome, deciding) = if let Some((i, _)) = denied {
        (Outcome::Denied, Some(i))
    } else if let Some((i, _)) = unavailable {
        (Outcome::Unavailable, Some(i))
    } else {
        let tightest = |it: &mut dyn Iterator<Item = (usize, &PolicyDecision)>| {
            it.min_by_key(|(_, p)| p.decision.remaining).map(|(i, _)| i)
        };
        let deciding =
            tightest(&mut enforced()).or_else(|| tightest(&mut evaluated.iter().enumerate()));
        (Outcome::Allowed, deciding)
    };
    Verdict {
        outcome,
        deciding_index: deciding,
        evaluated,
        permit: None,
        reservation: None,
    }
}

#[cfg(test)]
mod tests {
    use super::{Mode, Outcome};

    /// The names answers carry (the wire contract), the same in JSON.
    #[test]
    fn modes_are_named_as_on_the_wire() {
        let names = [
            "enforced",
            "shadow",
            "fail_open",
            "local",
            "fail_closed",
            "local_limit",
        ];
        assert_eq!(Mode::ALL.map(Mode::as_str), names);
        let json = serde_json::to_string(&Mode::ALL).expect("serialises");
        assert_eq!(
            json,
            r#"["enforced","shadow","fail_open","local","fail_closed","local_limit"]"#
        );
    }

    #[test]
    fn outcomes_are_named_as_on_the_wire() {
        let all = [Outcome::Allowed, Outcome::Denied, Outcome::Unavailable];
        let json = serde_json::to_string(&all).expect("serialises");
        assert_eq!(json, r#"["allowed","denied","unavailable"]"#);
    }
}
