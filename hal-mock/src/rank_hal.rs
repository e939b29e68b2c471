//! The per-rank HAL a worker owns: [`taskd_core::RankHal`] over the simulated HCCL.

use crate::fabric::Fabric;
use crate::hccl::NIC_SET_OP;
use std::sync::Arc;
use taskd_core::{
    GlobalRank, GroupInfo, GroupRank, GroupsFuture, HalError, HalFuture, HcclCode, HcclSetup,
    RankHal, SwitchCapabilities, TaskRankHal,
};

/// One simulated training process's view of HCCL, handed to the worker of `rank`.
///
/// Why a cheap clonable handle: the worker owns one, the test may hold another for the same
/// rank (that is how a test provokes a concurrent call, which HCCL forbids).
#[derive(Clone, Debug)]
pub struct MockRankHal {
    fabric: Arc<Fabric>,
    rank: GlobalRank,
}

/// Where the handles come from: the fabric hands them out, one per rank or node.
impl Fabric {
    /// The handle a worker uses for `rank`. Any rank is accepted; calls for a rank outside
    /// the fabric fail with `HCCL_E_NOT_FOUND`.
    pub fn rank_hal(self: &Arc<Self>, rank: GlobalRank) -> MockRankHal {
        MockRankHal::new(Arc::clone(self), rank)
    }
}

impl MockRankHal {
    pub(crate) fn new(fabric: Arc<Fabric>, rank: GlobalRank) -> Self {
        MockRankHal { fabric, rank }
    }

    /// The rank this handle acts for.
    pub fn rank(&self) -> GlobalRank {
        self.rank
    }

    /// The fabric this handle acts on.
    pub fn fabric(&self) -> &Arc<Fabric> {
        &self.fabric
    }

    /// An all-reduce on `group` as this rank (see [`Fabric::all_reduce`]).
    pub fn all_reduce(&self, group: &str, value: f64) -> Result<f64, HalError> {
        self.fabric.all_reduce(group, self.rank, value)
    }

    /// [`RankHal::set_working_nic`] as a future (on a tokio runtime): the call waits for the
    /// group's other members as a task instead of blocking a thread, so thousands of
    /// simulated ranks can be inside one rendezvous at once. The same rules, answers and log.
    pub async fn set_working_nic_async(
        &self,
        group: &str,
        ranks: &[GroupRank],
        use_backup: &[bool],
    ) -> Result<(), HalError> {
        self.fabric
            .set_working_nic_async(self.rank, group, ranks, use_backup)
            .await
    }

    fn alive(&self, op: &str) -> Result<(), HalError> {
        if self.fabric.is_shut_down() {
            return Err(HalError::new(
                op,
                HcclCode::Unavail,
                "the simulated fabric was shut down",
            ));
        }
        if self.rank.0 >= self.fabric.world_size() {
            return Err(HalError::new(
                op,
                HcclCode::NotFound,
                format!("no rank {} in the fabric", self.rank),
            ));
        }
        if self.fabric.is_dead(self.rank) {
            return Err(HalError::new(
                op,
                HcclCode::NotFound,
                format!("the process of rank {} was killed", self.rank),
            ));
        }
        Ok(())
    }
}

impl RankHal for MockRankHal {
    /// The rank's groups in the fabric's fixed order (world, tp, dp).
    fn groups(&mut self) -> Result<Vec<GroupInfo>, HalError> {
        self.alive("HcclGetCommName")?;
        Ok(self.fabric.groups_of(self.rank))
    }

    fn set_working_nic(
        &mut self,
        group: &str,
        ranks: &[GroupRank],
        use_backup: &[bool],
    ) -> Result<(), HalError> {
        self.fabric
            .set_working_nic(self.rank, group, ranks, use_backup)
    }

    fn capabilities(&mut self) -> SwitchCapabilities {
        let l2_retry = self.alive(NIC_SET_OP).is_ok() && self.fabric.l2_retry(self.rank);
        HcclSetup {
            l2_retry,
            rdma: self.fabric.config().rdma,
        }
        .capabilities()
    }
}

/// The simulated rank as a task: a NIC set waits in the group's rendezvous as a future
/// ([`MockRankHal::set_working_nic_async`]), so thousands of ranks fit in one process.
impl TaskRankHal for MockRankHal {
    fn groups(&mut self) -> GroupsFuture<'_> {
        Box::pin(std::future::ready(RankHal::groups(self)))
    }

    fn set_working_nic<'a>(
        &'a mut self,
        group: &'a str,
        ranks: &'a [GroupRank],
        use_backup: &'a [bool],
    ) -> HalFuture<'a> {
        Box::pin(self.set_working_nic_async(group, ranks, use_backup))
    }

    fn capabilities(&mut self) -> SwitchCapabilities {
        RankHal::capabilities(self)
    }
}

#[cfg(test)]
mod tests {
    use crate::test_support::*;
    use crate::WORLD_GROUP;
    use taskd_core::{HcclCode, HcclSetup, RankHal, SwitchCapabilities};

    #[test]
    fn a_rank_reports_its_groups_and_capabilities() {
        let f = fabric(1, 4, 2);
        let mut hal = f.rank_hal(r(3));
        assert_eq!(hal.rank(), r(3));
        let names: Vec<String> = hal.groups().unwrap().into_iter().map(|g| g.name).collect();
        assert_eq!(names, [WORLD_GROUP, "tp_1", "dp_1"]);
        assert_eq!(hal.capabilities(), SwitchCapabilities::ALL);
        f.set_l2_retry(r(3), false);
        assert!(hal.capabilities().lacks(&HcclSetup::L2_RETRY_OFF));
        assert_eq!(
            f.rank_hal(r(4)).groups().unwrap_err().hccl(),
            Some(HcclCode::NotFound)
        );
    }
}
