//! What each policy's decision counts as: the `outcome` label of `sluice_decisions_total` and of
//! `sluice_reports_total`, as bounded enums (every series is registered up front from `ALL`).

use super::verdict::Mode;

/// A label enum: its variants (each with the label it is counted under), `ALL` for
/// registering every series up front, and `as_str`.
macro_rules! label_enum {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$doc:meta])* $variant:ident => $label:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name {
            $($(#[$doc])* $variant,)+
        }

        impl $name {
            /// Every value, for registering the series up front.
            pub const ALL: [Self; [$(Self::$variant),+].len()] = [$(Self::$variant),+];

            /// The metric label.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $label,)+
                }
            }
        }
    };
}

label_enum! {
    /// A value of the `outcome` label of `sluice_decisions_total`. `LocalAllowed` and
    /// `LocalDenied` are the `local` failure mode's (the store could not answer); a policy's
    /// `local_limit` denies as `LocalLimitDenied` (the store was not asked); `Unmatched` counts
    /// checks that matched no policy (with an empty `policy` label).
    pub enum DecisionOutcome {
        /// Allowed (by the store, or a shadow policy that would allow).
        Allowed => "allowed",
        /// Denied by the store (or the local layer of recent denials).
        Denied => "denied",
        /// A shadow policy that would have denied.
        ShadowDenied => "shadow_denied",
        /// The store could not answer; the policy fails open.
        FailOpen => "fail_open",
        /// The store could not answer; the policy fails closed.
        FailClosed => "fail_closed",
        /// The store could not answer; this pod's share allowed.
        LocalAllowed => "local_allowed",
        /// The store could not answer; this pod's share denied.
        LocalDenied => "local_denied",
        /// Denied by the policy's local limit in this pod.
        LocalLimitDenied => "local_limit_denied",
        /// The check matched no policy.
        Unmatched => "unmatched",
    }
}

impl DecisionOutcome {
    /// What a policy's decision reached in `mode` counts as.
    pub fn of(mode: Mode, allowed: bool) -> Self {
        match (mode, allowed) {
            (Mode::FailOpen, _) => Self::FailOpen,
            (Mode::FailClosed, _) => Self::FailClosed,
            (Mode::Local, true) => Self::LocalAllowed,
            (Mode::Local, false) => Self::LocalDenied,
            (Mode::LocalLimit, _) => Self::LocalLimitDenied,
            (Mode::Enforced, false) => Self::Denied,
            (Mode::Shadow, false) => Self::ShadowDenied,
            (_, true) => Self::Allowed,
        }
    }

    /// Whether a policy's decision can count as this (every value but `Unmatched`, which has
    /// no policy).
    pub fn has_policy(self) -> bool {
        self != Self::Unmatched
    }
}

label_enum! {
    /// A value of the `outcome` label of `sluice_reports_total`.
    pub enum ReportOutcome {
        /// The limit held the cost.
        Within => "within",
        /// Spent past the limit: the next check is denied.
        Over => "over",
        /// Spent in this pod's share: the store could not answer.
        Local => "local",
        /// A fail-open policy's report, lost: the store could not answer.
        Lost => "lost",
        /// A fail-closed policy's report, refused (503).
        Refused => "refused",
        /// A report to a policy with `reports: false`, not accepted (403): nothing spent.
        Disabled => "disabled",
    }
}

impl ReportOutcome {
    /// What a policy's spend reached in `mode` counts as.
    pub fn of(mode: Mode, allowed: bool) -> Self {
        match (mode, allowed) {
            (Mode::FailOpen, _) => Self::Lost,
            (Mode::FailClosed, _) => Self::Refused,
            (Mode::Local, _) => Self::Local,
            (_, true) => Self::Within,
            (_, false) => Self::Over,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The label values dashboards and alerts name: they never change.
    #[test]
    fn labels_are_the_published_ones() {
        assert_eq!(
            DecisionOutcome::ALL.map(DecisionOutcome::as_str),
            [
                "allowed",
                "denied",
                "shadow_denied",
                "fail_open",
                "fail_closed",
                "local_allowed",
                "local_denied",
                "local_limit_denied",
                "unmatched",
            ]
        );
        assert_eq!(
            ReportOutcome::ALL.map(ReportOutcome::as_str),
            ["within", "over", "local", "lost", "refused", "disabled"]
        );
    }

    /// The metric's doc comment in `telemetry.rs` names every outcome.
    #[test]
    fn the_metric_doc_lists_every_outcome() {
        let labels = DecisionOutcome::ALL.map(DecisionOutcome::as_str);
        crate::telemetry::assert_doc_lists("decisions", labels);
    }
}
