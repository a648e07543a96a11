//! What `/v1/authz` believes of the headers a proxy forwards: a proxy in front of sluice copies
//! the client's own headers into the subrequest unless told otherwise, so every header that can
//! change a decision is honoured only when the operator names it here.

use serde::{Deserialize, Serialize};

use super::SettingsError;

/// `[authz]`: the trust given to `/v1/authz` headers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthzSettings {
    /// Where the original request's method and URI come from.
    pub original: OriginalFrom,
    /// Descriptors taken from `X-Sluice-Descriptor-<name>` headers; any other descriptor header
    /// is refused (400). `method` and `path` always come from the original request.
    pub descriptors: Vec<String>,
    /// Control headers honoured (`policy`, `cost`, `dry_run`); off unless listed, and refused
    /// (400) when sent while off.
    pub control: Vec<ControlHeader>,
    /// The older opt-in to case-insensitive paths. Path matching now ignores case by default,
    /// for every transport (a policy opts out with `path_case: exact`), so `true` is what sluice
    /// does anyway and `false` is refused: it would no longer mean what it says.
    pub path_case_insensitive: bool,
}

impl Default for AuthzSettings {
    fn default() -> Self {
        Self {
            original: OriginalFrom::Nginx,
            descriptors: ["ip", "tenant", "api_key"].map(str::to_owned).to_vec(),
            control: Vec::new(),
            path_case_insensitive: true,
        }
    }
}

/// The proxy convention for the original method and URI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OriginalFrom {
    /// `X-Original-Method` / `X-Original-URI` (nginx `auth_request`).
    Nginx,
    /// `X-Forwarded-Method` / `X-Forwarded-Uri` (Traefik `forwardAuth`).
    Traefik,
    /// The subrequest's own method and the path after `/v1/authz` (Envoy `ext_authz` with a
    /// `path_prefix`).
    Path,
}

/// A header that changes how a check is made rather than what it is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlHeader {
    /// `X-Sluice-Policy`: check only the named policy (skipping its `match`).
    Policy,
    /// `X-Sluice-Cost`: spend more than one unit.
    Cost,
    /// `X-Sluice-Dry-Run`: evaluate without spending.
    DryRun,
}

impl ControlHeader {
    /// Every control header.
    pub const ALL: [Self; 3] = [Self::Policy, Self::Cost, Self::DryRun];

    /// The header's name (lowercase, as `HeaderMap` keys are).
    pub fn header(self) -> &'static str {
        match self {
            Self::Policy => "x-sluice-policy",
            Self::Cost => "x-sluice-cost",
            Self::DryRun => "x-sluice-dry-run",
        }
    }
}

impl AuthzSettings {
    /// Names must be descriptor names as headers carry them (lowercase); `method` and `path`
    /// cannot be listed (they come from the original request).
    pub fn validate(&self) -> Result<(), SettingsError> {
        if !self.path_case_insensitive {
            return Err(SettingsError(
                "authz.path_case_insensitive = false is no longer supported: path matching \
                 ignores case by default on every transport; remove the setting and give the \
                 policies that need exact case `path_case: exact`"
                    .into(),
            ));
        }
        for name in &self.descriptors {
            let valid = !name.is_empty()
                && name.len() <= 64
                && name.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'
                });
            if !valid {
                return Err(SettingsError(format!(
                    "authz.descriptors: {name:?} is not a lowercase descriptor name"
                )));
            }
            if name == "method" || name == "path" {
                return Err(SettingsError(format!(
                    "authz.descriptors: {name:?} always comes from the original request; \
                     remove it"
                )));
            }
        }
        Ok(())
    }

    /// Whether `control` is honoured.
    pub fn allows(&self, control: ControlHeader) -> bool {
        self.control.contains(&control)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_older_exact_case_setting_is_refused_with_what_to_do_instead() {
        let mut settings = AuthzSettings::default();
        settings.validate().expect("the default is valid");
        settings.path_case_insensitive = false;
        let error = settings.validate().expect_err("refused").to_string();
        assert!(error.contains("`path_case: exact`"), "{error}");
    }
}
