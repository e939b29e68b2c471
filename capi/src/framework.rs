//! The framework HAL: a rank HAL for training frameworks that move every communicator of the
//! process themselves.
//!
//! MindSpore (`mindspore.communication.management._comm_switch_nic(global_ranks, use_backup)`)
//! and torch_npu (`torch_npu.npu._comm_switch_nic(ranks, useBackup)`) take the **whole** target
//! list in global ranks, once, and map it onto each of their HCCL groups themselves. taskd does
//! not see those groups, so this HAL describes the process as one group, [`FRAMEWORK_GROUP`],
//! whose members are every rank of the job in rank order (group rank = global rank). The worker's
//! planner then makes exactly one call per operation, with every target in the operator's order,
//! and that call reaches the framework's function unchanged.
//!
//! What the manager's checks mean then (README, "In a MindSpore or PyTorch job"): the digest a
//! worker reports is the digest of that one call, so "every member agrees" means every rank
//! handed its framework the same list; a verification round compares what each rank's
//! framework was told, rank by rank. Agreement inside each HCCL group is the framework's part:
//! it returns `False` (a failed call, and a rollback) unless every group succeeded.

use taskd_core::{
    GlobalRank, GroupInfo, GroupRank, HalError, HalErrorKind, Library, RankHal, SwitchCapabilities,
};

/// The one group a framework HAL reports: every rank of the job, group rank = global rank.
pub const FRAMEWORK_GROUP: &str = "framework";

/// A framework's switch function.
pub trait FrameworkSwitch: Send {
    /// Moves every communicator of this process so that `ranks[i]` (global ranks) uses its
    /// backup NIC when `use_backup[i]`. `Err` carries the framework's reason (a `False`
    /// answer, an exception's message).
    fn switch_nic(&mut self, ranks: &[u32], use_backup: &[bool]) -> Result<(), String>;
}

impl<F> FrameworkSwitch for F
where
    F: FnMut(&[u32], &[bool]) -> Result<(), String> + Send,
{
    fn switch_nic(&mut self, ranks: &[u32], use_backup: &[bool]) -> Result<(), String> {
        self(ranks, use_backup)
    }
}

/// How a framework HAL learns the job's size: from the registration, which the proxy answers
/// before it hands the worker any directive. `None`: not registered.
pub type WorldSize = Box<dyn FnMut() -> Option<u32> + Send>;

/// A rank HAL whose switch is one call of the framework's function.
pub struct FrameworkHal {
    switch: Box<dyn FrameworkSwitch>,
    world: WorldSize,
    capabilities: SwitchCapabilities,
}

impl FrameworkHal {
    /// A HAL calling `switch`, for a job of `world` ranks, whose HCCL setup allows
    /// `capabilities` (L2 retry, RDMA: from the environment, as for `AscendRankHal`).
    pub fn new(
        switch: Box<dyn FrameworkSwitch>,
        world: WorldSize,
        capabilities: SwitchCapabilities,
    ) -> Self {
        FrameworkHal {
            switch,
            world,
            capabilities,
        }
    }
}

impl RankHal for FrameworkHal {
    fn groups(&mut self) -> Result<Vec<GroupInfo>, HalError> {
        let n = (self.world)().ok_or_else(|| {
            HalError::uncoded(
                "groups",
                Library::Hccl,
                HalErrorKind::Unavailable,
                "the job's size is not known before the worker registered",
            )
        })?;
        Ok(vec![GroupInfo {
            name: FRAMEWORK_GROUP.to_owned(),
            members: (0..n).map(GlobalRank).collect(),
        }])
    }

    fn set_working_nic(
        &mut self,
        group: &str,
        ranks: &[GroupRank],
        use_backup: &[bool],
    ) -> Result<(), HalError> {
        if group != FRAMEWORK_GROUP {
            return Err(HalError::uncoded(
                "_comm_switch_nic",
                Library::Hccl,
                HalErrorKind::InvalidArgument,
                format!("the framework HAL has one group, {FRAMEWORK_GROUP}, not {group}"),
            ));
        }
        // Group rank = global rank in the framework group.
        let global: Vec<u32> = ranks.iter().map(|r| r.0).collect();
        self.switch
            .switch_nic(&global, use_backup)
            .map_err(|reason| {
                HalError::uncoded(
                    "_comm_switch_nic",
                    Library::Hccl,
                    HalErrorKind::Other,
                    reason,
                )
            })
    }

    fn capabilities(&mut self) -> SwitchCapabilities {
        self.capabilities
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use taskd_core::{plan_calls, NicSide};

    type Calls = Arc<Mutex<Vec<(Vec<u32>, Vec<bool>)>>>;

    fn hal(world: Option<u32>, fail: bool) -> (FrameworkHal, Calls) {
        let calls: Calls = Arc::default();
        let seen = calls.clone();
        let switch = move |r: &[u32], b: &[bool]| {
            seen.lock().unwrap().push((r.to_vec(), b.to_vec()));
            if fail {
                Err("_comm_switch_nic returned False".to_owned())
            } else {
                Ok(())
            }
        };
        let hal = FrameworkHal::new(
            Box::new(switch),
            Box::new(move || world),
            SwitchCapabilities::ALL,
        );
        (hal, calls)
    }

    #[test]
    fn one_call_per_operation_with_the_whole_list() {
        let (mut h, calls) = hal(Some(8), false);
        let groups = h.groups().unwrap();
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].members.len(), 8);
        // Targets on other nodes, in the operator's order: the plan is one call, unchanged.
        let targets = [
            (GlobalRank(6), NicSide::Backup),
            (GlobalRank(2), NicSide::Backup),
            (GlobalRank(3), NicSide::Primary),
        ];
        let plan = plan_calls(&groups, &targets);
        assert_eq!(plan.len(), 1);
        for call in &plan {
            h.set_working_nic(&call.group, &call.ranks, &call.use_backup())
                .unwrap();
        }
        assert_eq!(
            *calls.lock().unwrap(),
            vec![(vec![6, 2, 3], vec![true, true, false])]
        );
    }

    #[test]
    fn the_frameworks_refusal_is_the_calls_error() {
        let (mut h, _) = hal(Some(4), true);
        let e = h
            .set_working_nic(FRAMEWORK_GROUP, &[GroupRank(1)], &[true])
            .unwrap_err();
        assert_eq!(e.kind, HalErrorKind::Other);
        assert_eq!(
            e.to_string(),
            "_comm_switch_nic failed (other): _comm_switch_nic returned False"
        );
        let e = h
            .set_working_nic("tp-0", &[GroupRank(1)], &[true])
            .unwrap_err();
        assert_eq!(e.kind, HalErrorKind::InvalidArgument);
        let (mut unregistered, _) = hal(None, false);
        assert_eq!(
            unregistered.groups().unwrap_err().kind,
            HalErrorKind::Unavailable
        );
        assert_eq!(h.capabilities(), SwitchCapabilities::ALL);
    }
}
