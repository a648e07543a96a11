//! Stand-ins: policies converted from envoyproxy/ratelimit rules that sluice's limits cannot
//! say. Each carries its kind explicitly (`envoy_stand_in` in a policy file), so that its meaning
//! survives a rename and no policy takes it on by its name alone.

/// A converted policy that stands for a rule sluice's limits cannot say: a policy that never
/// limits by itself (a shadow one that wins its group, or the override one no request selects
/// without an override); the check's group and the gRPC answer give it upstream's meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StandIn {
    /// `unlimited: true`: OK, no `current_limit`, the largest `limit_remaining`.
    Unlimited,
    /// A node without `rate_limit`: OK, no `current_limit`, `limit_remaining` 0.
    Exempt,
    /// `requests_per_unit: 0` (or no `requests_per_unit`, which upstream reads as 0): every
    /// request is over the limit. Written as a block list (`deny: true`), never as a field value.
    Blocked,
    /// [`StandIn::Blocked`] with `shadow_mode`: OK with `current_limit` 0 per unit, a shadow
    /// denial in the metrics and the shadow log.
    ShadowBlocked,
    /// A domain's limit overrides: selected only by a descriptor with a `limit`, whose quota it
    /// takes (enforced, a counter per descriptor); the descriptor's other policies take no part.
    #[serde(rename = "limit_override")]
    Override,
}

impl StandIn {
    /// Every kind.
    pub const ALL: [Self; 5] = [
        Self::Unlimited,
        Self::Exempt,
        Self::Blocked,
        Self::ShadowBlocked,
        Self::Override,
    ];

    /// The kind's name, as a policy file writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unlimited => "unlimited",
            Self::Exempt => "exempt",
            Self::Blocked => "blocked",
            Self::ShadowBlocked => "shadow_blocked",
            Self::Override => "limit_override",
        }
    }

    /// The prefix the converter gives its policies' names. Reserved: a policy so named must be
    /// of this kind (a limit's name never has it).
    pub fn prefix(self) -> &'static str {
        match self {
            Self::Unlimited => "rls-unlimited-",
            Self::Exempt => "rls-exempt-",
            Self::Blocked => "rls-blocked-",
            Self::ShadowBlocked => "rls-shadow-blocked-",
            Self::Override => "rls-override-",
        }
    }

    /// Whether it stands for no limit (`Unlimited`, `Exempt`).
    pub fn is_no_limit(self) -> bool {
        matches!(self, Self::Unlimited | Self::Exempt)
    }

    /// The kind whose reserved prefix `policy_name` has: only to refuse a name that poses as a
    /// stand-in; a policy's kind is its field, never its name.
    pub fn reserving(policy_name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|kind| policy_name.starts_with(kind.prefix()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_values_are_the_kinds_names() {
        for kind in StandIn::ALL {
            let read: StandIn = serde_yaml::from_str(kind.as_str()).expect("reads");
            assert_eq!(read, kind);
        }
        assert!(serde_yaml::from_str::<StandIn>("override").is_err());
    }

    #[test]
    fn reserved_prefixes_are_recognised_longest_kind_first() {
        assert_eq!(
            StandIn::reserving("rls-shadow-blocked-x"),
            Some(StandIn::ShadowBlocked)
        );
        assert_eq!(
            StandIn::reserving("rls-override-d"),
            Some(StandIn::Override)
        );
        assert_eq!(StandIn::reserving("rls-overrides"), None);
        assert_eq!(StandIn::reserving("my-rls-override-x"), None);
    }
}
