//! [`AscendNodeHal`]: the per-node HAL over DCMI.

use crate::result::{self, DcmiError, NetworkHealth};
use crate::sys::dcmi::DcmiLib;
use taskd_core::{DeviceId, HalError, HalErrorKind, Library, LinkHealth, NodeHal};

/// Where a logical NPU sits, in DCMI's numbering.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DcmiLocation {
    pub card_id: i32,
    pub device_id: i32,
}

/// The per-node HAL: NIC link health (the proxy's [`NodeHal`]) and, for preflight, the device
/// count, read through DCMI.
///
/// **Device numbering.** A [`DeviceId`] is the NPU's *logical* id, the one
/// `aclrtSetDevice`, `ASCEND_RT_VISIBLE_DEVICES` and `npu-smi info -m` ("Chip Logic ID") use.
/// DCMI addresses chips as `(card_id, device_id)`; the mapping is
/// `dcmi_get_card_id_device_id_from_logicid`.
///
/// **Link health.** `primary_up` is `dcmi_get_device_network_health` of the device itself.
/// `backup_up` is the same probe on the *partner die* ([`DeviceId::partner`]): on Atlas A3
/// each NPU card carries two dies, and a die's backup NIC is its partner's NIC (DESIGN.md
/// section 1). The partner must sit on the same card; if DCMI places it elsewhere (a
/// one-die-per-card product such as A2), `link_health` fails instead of guessing.
///
/// The probe reports reachability of a detect IP the operator configures per NIC
/// (`hccn_tool -i <id> -netdetect -s address <ip>`, usually the gateway; MindCluster toolbox
/// guide, "使用hccn_tool工具配置RoCE网卡IP地址和子网掩码"), so a NIC without a detect IP
/// never reads as up. It is a reachability probe, not the physical port state. Only
/// `DCMI_RDFX_DETECT_OK` counts as up; see [`NetworkHealth::is_up`].
pub struct AscendNodeHal {
    dcmi: DcmiLib,
}

impl AscendNodeHal {
    /// Calls `dcmi_init` and keeps the library.
    pub fn new(dcmi: DcmiLib) -> Result<Self, DcmiError> {
        result::dcmi::init(&dcmi)?;
        Ok(AscendNodeHal { dcmi })
    }

    /// `(card_id, device_id)` of a logical NPU.
    pub fn locate(&self, device: DeviceId) -> Result<DcmiLocation, DcmiError> {
        let (card_id, device_id) =
            result::dcmi::get_card_id_device_id_from_logicid(&self.dcmi, device.0)?;
        Ok(DcmiLocation { card_id, device_id })
    }

    /// The raw probe result of one logical NPU's own NIC.
    pub fn network_health(&self, device: DeviceId) -> Result<NetworkHealth, DcmiError> {
        let at = self.locate(device)?;
        result::dcmi::get_device_network_health(&self.dcmi, at.card_id, at.device_id)
    }

    /// The node's NPU count: the sum of `dcmi_get_device_num_in_card` over
    /// `dcmi_get_card_list`. Only preflight (`taskd doctor`) asks; the proxy never needs it.
    pub fn device_count(&self) -> Result<u32, DcmiError> {
        let mut total: u32 = 0;
        for card in result::dcmi::get_card_list(&self.dcmi)? {
            let n = result::dcmi::get_device_num_in_card(&self.dcmi, card)?;
            total += u32::try_from(n).unwrap_or(0);
        }
        Ok(total)
    }
}

impl NodeHal for AscendNodeHal {
    fn link_health(&mut self, device: DeviceId) -> Result<LinkHealth, HalError> {
        let own = self.locate(device)?;
        let partner_id = device.partner();
        let partner = self.locate(partner_id)?;
        if partner.card_id != own.card_id {
            return Err(HalError::uncoded(
                "dcmi_get_card_id_device_id_from_logicid",
                Library::Dcmi,
                HalErrorKind::NotSupported,
                format!(
                    "device {device} is on card {} but its partner die {partner_id} is on card \
                     {}: no backup NIC mapping for this product",
                    own.card_id, partner.card_id
                ),
            ));
        }
        let health = |at: DcmiLocation| {
            result::dcmi::get_device_network_health(&self.dcmi, at.card_id, at.device_id)
        };
        Ok(LinkHealth {
            device,
            primary_up: health(own)?.is_up(),
            backup_up: health(partner)?.is_up(),
        })
    }
}
