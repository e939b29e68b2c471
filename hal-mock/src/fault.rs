//! Faults a test injects into the simulated HCCL, and the record of every NIC-set call.

use std::time::Duration;
use taskd_core::{GlobalRank, GroupRank, HcclCode};

/// A fault for one rank's next `HcclCommWorkingDevNicSet` call (see
/// [`Fabric::inject_nic_set_fault`](crate::Fabric::inject_nic_set_fault)). Faults queue per
/// rank and each is consumed by exactly one call, so a test can script "the second call of
/// rank 3 fails" by queueing `Slow(ZERO)` first.
///
/// Why these three: they are the ways a real NIC-set call misbehaves that the control plane
/// must survive (an error, a call that never seems to return, a slow call), and each leaves
/// the group in a different state the rollback has to cope with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NicSetFault {
    /// The rank joins the rendezvous normally, but at completion it does not apply the change
    /// and returns `code`. Its peers apply and succeed, so the group now disagrees about its
    /// NIC configuration: exactly the split state the control plane must roll back.
    Fail(HcclCode),
    /// The call hangs for `duration` (in the calling thread, interrupted only by
    /// [`Fabric::shutdown`](crate::Fabric::shutdown) or the rank being killed), then joins
    /// the rendezvous as a failed member (like [`NicSetFault::Fail`]) and returns `code`.
    /// Peers wait for it meanwhile and time out if `duration` exceeds the HCCL timeout.
    Hang {
        /// How long the call hangs before joining the rendezvous.
        duration: Duration,
        /// What the call finally returns.
        code: HcclCode,
    },
    /// The call takes `Duration` longer, then behaves normally: for deadline tests.
    Slow(Duration),
}

/// One `HcclCommWorkingDevNicSet` call as the simulator saw it, in completion order.
///
/// Why: tests assert on the exact conversation the control plane had with HCCL (which rank
/// called which group with which arguments, and what came back), not only on the end state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicSetRecord {
    /// The calling process.
    pub rank: GlobalRank,
    /// The group the call named (as given, even if unknown).
    pub group: String,
    /// The `ranks` argument (group ranks).
    pub ranks: Vec<GroupRank>,
    /// The `useBackup` argument.
    pub use_backup: Vec<bool>,
    /// What the call returned.
    pub result: HcclCode,
    /// Whether the call changed this rank's view of the group. `false` for every error and
    /// for the silent no-op HCCL performs when L2 retry is off or there is no RDMA.
    pub applied: bool,
}
