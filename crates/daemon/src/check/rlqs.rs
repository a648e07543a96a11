//! What Envoy's rate limit quota service (`transport::grpc::rlqs`) needs of the decision path:
//! a request planned exactly as a check would be (same matching, tiers, costs, keys), and the
//! store to take leases from. Nothing here decides or spends.

use std::sync::Arc;

use super::{CheckError, CheckRequest, CheckService, Plan};
use crate::store::RateStore;

impl CheckService {
    /// The plan a check of `request` would run under the policies in force (validated, policies
    /// matched, replaced ones dropped): its store checks and their parts. Nothing is spent.
    pub async fn plan_request(&self, request: &CheckRequest) -> Result<Plan, CheckError> {
        self.plan(&self.policies(), request).await
    }

    /// The store the checks go to (quota leases are taken from it).
    pub fn store(&self) -> &Arc<dyn RateStore> {
        &self.store
    }
}
