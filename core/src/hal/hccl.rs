//! HCCL's part of a rank's capabilities: what its NIC set (`HcclCommWorkingDevNicSet`) needs of
//! the process's setup, in HCCL's words. Shared by the backends that are HCCL, the real one
//! (`taskd-hal-ascend`, from the environment) and the simulated one (`taskd-hal-mock`), as
//! [`super::HcclCode`] is; nothing else in the control plane reads it.

use super::{HcclCode, Missing, SwitchCapabilities};

/// What HCCL's NIC set needs of a rank's setup: without either it answers success and changes
/// nothing, which a switch must not take for a switch.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct HcclSetup {
    /// `HCCL_OP_RETRY_ENABLE` contains `L2:1` for this process's HCCL.
    pub l2_retry: bool,
    /// The topology has RDMA links (no RDMA: HCCL's NIC set is a silent no-op).
    pub rdma: bool,
}

impl HcclSetup {
    /// Both present: a fully configured rank.
    pub const ALL: HcclSetup = HcclSetup {
        l2_retry: true,
        rdma: true,
    };

    /// What a rank without L2 retry lacks.
    pub const L2_RETRY_OFF: Missing =
        Missing::new(HcclCode::LIBRARY, "HCCL_OP_RETRY_ENABLE without L2:1");

    /// What a rank whose topology has no RDMA links lacks.
    pub const NO_RDMA: Missing = Missing::new(HcclCode::LIBRARY, "no RDMA links");

    /// What this setup lacks for a switch, as the rank contract says it.
    pub fn capabilities(self) -> SwitchCapabilities {
        let l2 = (!self.l2_retry).then_some(HcclSetup::L2_RETRY_OFF);
        let rdma = (!self.rdma).then_some(HcclSetup::NO_RDMA);
        SwitchCapabilities::lacking(l2.into_iter().chain(rdma))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_missing_part_is_named_in_hccls_words() {
        assert_eq!(HcclSetup::ALL.capabilities(), SwitchCapabilities::ALL);
        let none = HcclSetup {
            l2_retry: false,
            rdma: false,
        }
        .capabilities();
        assert_eq!(
            none.to_string(),
            "HCCL_OP_RETRY_ENABLE without L2:1, no RDMA links"
        );
        assert!(none.missing().all(|m| m.by == HcclCode::LIBRARY));
    }
}
