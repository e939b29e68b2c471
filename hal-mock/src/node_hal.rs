//! The per-node HAL a proxy owns: [`taskd_core::NodeHal`] over the simulated ports.

use crate::fabric::Fabric;
use std::sync::Arc;
use taskd_core::{DeviceId, HalError, HalErrorKind, LinkHealth, NodeHal, NodeName};

const LINK_OP: &str = "sim_get_device_network_health";

/// One simulated server's device management view, handed to the proxy of that node.
///
/// Why: the manager checks that a target NIC's link is up before switching onto it; this is
/// where that answer comes from in tests, driven by [`Fabric::set_link`].
#[derive(Clone, Debug)]
pub struct MockNodeHal {
    fabric: Arc<Fabric>,
    node_index: u32,
}

/// Where the handles come from: the fabric hands them out, one per rank or node.
impl Fabric {
    /// The handle a proxy uses for node `node_index`. Any index is accepted; calls for a
    /// node outside the fabric fail with an invalid-argument error of the mock.
    pub fn node_hal(self: &Arc<Self>, node_index: u32) -> MockNodeHal {
        MockNodeHal::new(Arc::clone(self), node_index)
    }
}

impl MockNodeHal {
    pub(crate) fn new(fabric: Arc<Fabric>, node_index: u32) -> Self {
        MockNodeHal { fabric, node_index }
    }

    /// The node's index in the fabric.
    pub fn node_index(&self) -> u32 {
        self.node_index
    }

    /// The node's name, `node-{i}`.
    pub fn node_name(&self) -> NodeName {
        self.fabric.node_name(self.node_index)
    }

    fn check_node(&self, op: &str) -> Result<(), HalError> {
        if self.node_index < self.fabric.config().nodes {
            Ok(())
        } else {
            Err(crate::MOCK.uncoded(
                op,
                HalErrorKind::InvalidArgument,
                format!("no node {} in the fabric", self.node_index),
            ))
        }
    }
}

impl NodeHal for MockNodeHal {
    /// Primary = the device's own port; backup = its partner die's port ([`DeviceId::partner`]),
    /// reported down when the device has no partner (last device of an odd node).
    fn link_health(&mut self, device: DeviceId) -> Result<LinkHealth, HalError> {
        self.check_node(LINK_OP)?;
        let d = self.fabric.config().devices_per_node;
        if device.0 >= d {
            return Err(crate::MOCK.uncoded(
                LINK_OP,
                HalErrorKind::InvalidArgument,
                format!(
                    "no device {device} on node {} ({d} devices)",
                    self.node_index
                ),
            ));
        }
        let partner = device.partner();
        Ok(LinkHealth::new(
            device,
            self.fabric.link_up(self.node_index, device),
            partner.0 < d && self.fabric.link_up(self.node_index, partner),
        ))
    }
}

#[cfg(test)]
mod tests {
    use crate::test_support::*;
    use taskd_core::{DeviceId, HalErrorKind, LinkHealth, NicSide, NodeHal};

    #[test]
    fn link_health_reports_own_port_as_primary_and_partners_as_backup() {
        let f = fabric(2, 4, 4);
        let mut node = f.node_hal(1);
        assert_eq!(node.node_name().0, "node-1");
        f.set_link(1, DeviceId(2), false);
        assert!(!f.link_up(1, DeviceId(2)));
        assert_eq!(
            node.link_health(DeviceId(2)).unwrap(),
            LinkHealth::new(DeviceId(2), false, true)
        );
        let partner = node.link_health(DeviceId(3)).unwrap();
        assert!(partner.is_up(NicSide::Primary) && !partner.is_up(NicSide::Backup));
        // The other node is untouched.
        let other = f.node_hal(0).link_health(DeviceId(2)).unwrap();
        assert!(other.is_up(NicSide::Primary) && other.is_up(NicSide::Backup));
        let e = node.link_health(DeviceId(4)).unwrap_err();
        assert_eq!(
            (e.kind, e.vendor.library.as_str()),
            (HalErrorKind::InvalidArgument, "mock")
        );
        let e = f.node_hal(2).link_health(DeviceId(0)).unwrap_err();
        assert_eq!(e.kind, HalErrorKind::InvalidArgument);
        assert!(e.detail.contains("no node 2"), "{e}");
    }
}
