//! The operator's switch command and its resolution against the rank table.

use crate::display::short_list;
use crate::hal::NicSide;
use crate::ids::{DeviceId, GlobalRank, JobId, NodeName, OperationId};
use crate::rank_table::RankTable;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// One `(node, device) -> use_backup` entry of a command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// The node, by its rank-table name.
    pub node: NodeName,
    /// The die's physical id, as in the rank table ([`DeviceId`]).
    pub device: DeviceId,
    /// To the backup NIC (`true`) or back to the primary.
    pub use_backup: bool,
}

/// A request to move some devices onto their backup NIC (`use_backup = true`) or back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchCommand {
    /// The job the command is for.
    pub job: JobId,
    /// Client-chosen id; the manager generates one when absent.
    pub id: Option<OperationId>,
    /// The devices to move, in the operator's order.
    pub targets: Vec<Target>,
}

/// A target resolved to its global rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankTarget {
    /// The node.
    pub node: NodeName,
    /// The device on that node.
    pub device: DeviceId,
    /// The rank the device runs.
    pub rank: GlobalRank,
    /// The command's flag, as the operator and the wire formats give it; the control plane
    /// works with [`RankTarget::side`].
    pub use_backup: bool,
}

impl RankTarget {
    /// The side the target is moved to.
    pub fn side(&self) -> NicSide {
        NicSide::from_use_backup(self.use_backup)
    }
}

/// Which way a command moves traffic.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Every target to its backup NIC.
    ToBackup,
    /// Every target back to its primary NIC.
    ToPrimary,
    /// Some each way.
    Mixed,
}

impl Direction {
    /// The name used in logs, metrics labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::ToBackup => "to_backup",
            Direction::ToPrimary => "to_primary",
            Direction::Mixed => "mixed",
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A command whose targets all exist, each rank once, in the operator's order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchPlan {
    /// The resolved targets.
    pub targets: Vec<RankTarget>,
}

impl SwitchPlan {
    /// Which way the plan moves traffic.
    pub fn direction(&self) -> Direction {
        let backup = self.targets.iter().filter(|t| t.use_backup).count();
        match backup {
            0 => Direction::ToPrimary,
            n if n == self.targets.len() => Direction::ToBackup,
            _ => Direction::Mixed,
        }
    }

    /// `(rank, side)` pairs in the operator's order: the planner's input.
    pub fn rank_sides(&self) -> Vec<(GlobalRank, NicSide)> {
        self.targets.iter().map(|t| (t.rank, t.side())).collect()
    }
}

/// A command that cannot run as given. Nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ValidationError {
    /// The command names no target.
    #[error("the command has no targets: name at least one node and device")]
    NoTargets,
    /// A target's node is not in the rank table.
    #[error("node \"{node}\" is not part of the job (known nodes: {known})")]
    UnknownNode {
        /// The node named.
        node: NodeName,
        /// The job's nodes, as a short list.
        known: String,
    },
    /// A target's device is not one of its node's.
    #[error("device {device} does not exist on node \"{node}\" (it has devices {devices})")]
    UnknownDevice {
        /// The node.
        node: NodeName,
        /// The device named.
        device: DeviceId,
        /// The node's devices, as a short list.
        devices: String,
    },
    /// A device string of ClusterD's form is not a number.
    #[error("device {value:?} of node \"{node}\" is not a device number (decimal digits only, no spaces or signs)")]
    BadDevice {
        /// The node.
        node: NodeName,
        /// The string given.
        value: String,
    },
    /// ClusterD's form gives a node another number of ops than devices.
    #[error("node \"{node}\" lists {devs} devices but {ops} operations: give one op per dev")]
    LengthMismatch {
        /// The node.
        node: NodeName,
        /// How many devices it lists.
        devs: usize,
        /// How many ops it lists.
        ops: usize,
    },
    /// The two dies of one NPU are told opposite sides.
    #[error(
        "devices {node}:{first} and {node}:{second} are the two dies of one NPU (each is the other's backup NIC) and cannot be told opposite NICs in one command: HCCL refuses it; switch them the same way or in two commands"
    )]
    PartnerConflict {
        /// The node.
        node: NodeName,
        /// The lower device of the pair.
        first: DeviceId,
        /// The higher device of the pair.
        second: DeviceId,
    },
    /// One device is told both sides.
    #[error(
        "device {node}:{device} (rank {rank}) cannot move to its backup NIC: that NIC is its partner die {node}:{partner}'s, and the partner is not part of the job. HCCL switches only when both dies of an NPU are visible to the job (a partner in another job would have its NIC borrowed); give the job both dies of the NPU"
    )]
    PartnerNotInJob {
        /// The target's node.
        node: NodeName,
        /// The target die.
        device: DeviceId,
        /// The target's rank.
        rank: GlobalRank,
        /// The die whose NIC would be borrowed ([`DeviceId::partner`]), absent from the table.
        partner: DeviceId,
    },
    /// The command lists one die twice with opposite sides: no order between the two
    /// entries is implied, so neither can be chosen.
    #[error(
        "device {node}:{device} (rank {rank}) is listed twice, once to backup and once to primary"
    )]
    ConflictingTarget {
        /// The node.
        node: NodeName,
        /// The device.
        device: DeviceId,
        /// Its rank.
        rank: GlobalRank,
    },
}

impl SwitchCommand {
    /// Builds a command from ClusterD's `SwitchNics` form: per node, device strings and their
    /// ops (`true` = backup). Nodes are taken in name order. ClusterD's `dev` strings are
    /// physical device ids, like the rank table's ([`DeviceId`]).
    pub fn from_nic_ops(
        job: JobId,
        id: Option<OperationId>,
        nic_ops: &BTreeMap<String, (Vec<String>, Vec<bool>)>,
    ) -> Result<Self, ValidationError> {
        let mut targets = Vec::new();
        for (node, (devs, ops)) in nic_ops {
            let node = NodeName(node.clone());
            if devs.len() != ops.len() {
                return Err(ValidationError::LengthMismatch {
                    node,
                    devs: devs.len(),
                    ops: ops.len(),
                });
            }
            for (dev, op) in devs.iter().zip(ops) {
                let device =
                    decimal_id(dev)
                        .map(DeviceId)
                        .ok_or_else(|| ValidationError::BadDevice {
                            node: node.clone(),
                            value: dev.clone(),
                        })?;
                targets.push(Target {
                    node: node.clone(),
                    device,
                    use_backup: *op,
                });
            }
        }
        Ok(SwitchCommand { job, id, targets })
    }

    /// Resolves every target to its rank. A rank listed twice with the same op is kept once;
    /// with different ops it is refused. Devices are physical ids, as in the rank table
    /// ([`DeviceId`]).
    ///
    /// A target moving to its backup NIC must have its partner die ([`DeviceId::partner`]) in
    /// the job too: HCCL documents that the switch cannot run unless both dies of the NPU are
    /// visible to the job, and that when they belong to two jobs the switch borrows the other
    /// job's NIC. The rank table lists every die the job has, so a partner missing from it is
    /// refused here ([`ValidationError::PartnerNotInJob`]), before anything runs. (A move back
    /// to the primary NIC uses the die's own NIC and is never refused for this.)
    pub fn resolve(&self, table: &RankTable) -> Result<SwitchPlan, ValidationError> {
        if self.targets.is_empty() {
            return Err(ValidationError::NoTargets);
        }
        let mut seen: BTreeMap<GlobalRank, bool> = BTreeMap::new();
        let mut targets = Vec::with_capacity(self.targets.len());
        for t in &self.targets {
            if !table.has_node(&t.node) {
                return Err(ValidationError::UnknownNode {
                    node: t.node.clone(),
                    known: short_list(table.nodes()),
                });
            }
            let rank =
                table
                    .rank_of(&t.node, t.device)
                    .ok_or_else(|| ValidationError::UnknownDevice {
                        node: t.node.clone(),
                        device: t.device,
                        devices: short_list(table.devices_of(&t.node).map(|(d, _)| d)),
                    })?;
            let partner = t.device.partner();
            if t.use_backup && table.rank_of(&t.node, partner).is_none() {
                return Err(ValidationError::PartnerNotInJob {
                    node: t.node.clone(),
                    device: t.device,
                    rank,
                    partner,
                });
            }
            match seen.insert(rank, t.use_backup) {
                Some(prev) if prev != t.use_backup => {
                    return Err(ValidationError::ConflictingTarget {
                        node: t.node.clone(),
                        device: t.device,
                        rank,
                    })
                }
                Some(_) => continue,
                None => targets.push(RankTarget {
                    node: t.node.clone(),
                    device: t.device,
                    rank,
                    use_backup: t.use_backup,
                }),
            }
        }
        check_partners(&targets)?;
        Ok(SwitchPlan { targets })
    }
}

/// HCCL fails a NIC-set call that tells the two ends of a die pair opposite sides at once.
pub(crate) fn check_partners(targets: &[RankTarget]) -> Result<(), ValidationError> {
    let by_device: BTreeMap<(&NodeName, DeviceId), bool> = targets
        .iter()
        .map(|t| ((&t.node, t.device), t.use_backup))
        .collect();
    for t in targets {
        let partner = t.device.partner();
        if let Some(&other) = by_device.get(&(&t.node, partner)) {
            if other != t.use_backup {
                return Err(ValidationError::PartnerConflict {
                    node: t.node.clone(),
                    first: t.device.min(partner),
                    second: t.device.max(partner),
                });
            }
        }
    }
    Ok(())
}

/// A number as ClusterD writes one (a global rank, a device id): decimal digits only, no
/// sign, no spaces, no leading zero. ClusterD itself matches device ids as exact strings
/// against the rank table, so `" 2"`, `"+2"` or `"02"` name no device there either.
pub fn decimal_id(s: &str) -> Option<u32> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    canonical.then(|| s.parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_ids_are_plain_digits() {
        assert_eq!(decimal_id("0"), Some(0));
        assert_eq!(decimal_id("15"), Some(15));
        assert_eq!(decimal_id("4294967295"), Some(u32::MAX));
        for bad in [
            "",
            " 2",
            "2 ",
            "+2",
            "-2",
            "02",
            "00",
            "4294967296",
            "1e3",
            "٣",
        ] {
            assert_eq!(decimal_id(bad), None, "{bad:?}");
        }
    }

    fn cmd(targets: &[(&str, u32, bool)]) -> SwitchCommand {
        SwitchCommand {
            job: "j".into(),
            id: None,
            targets: targets
                .iter()
                .map(|(n, d, b)| Target {
                    node: (*n).into(),
                    device: DeviceId(*d),
                    use_backup: *b,
                })
                .collect(),
        }
    }

    #[test]
    fn resolves_in_order_and_names_direction() {
        let t = RankTable::uniform(2, 4);
        let p = cmd(&[("node-1", 2, true), ("node-0", 0, true)])
            .resolve(&t)
            .unwrap();
        assert_eq!(
            p.rank_sides(),
            vec![
                (GlobalRank(6), NicSide::Backup),
                (GlobalRank(0), NicSide::Backup)
            ]
        );
        assert_eq!(p.direction(), Direction::ToBackup);
        let p = cmd(&[("node-1", 2, true), ("node-0", 0, false)])
            .resolve(&t)
            .unwrap();
        assert_eq!(p.direction(), Direction::Mixed);
        let p = cmd(&[("node-1", 2, false)]).resolve(&t).unwrap();
        assert_eq!(p.direction(), Direction::ToPrimary);
    }

    #[test]
    fn every_bad_input_is_named() {
        let t = RankTable::uniform(2, 4);
        assert_eq!(cmd(&[]).resolve(&t), Err(ValidationError::NoTargets));
        let e = cmd(&[("node-9", 0, true)]).resolve(&t).unwrap_err();
        assert!(matches!(&e, ValidationError::UnknownNode { node, .. } if node.0 == "node-9"));
        assert!(e.to_string().contains("node-9"), "{e}");
        let e = cmd(&[("node-1", 4, true)]).resolve(&t).unwrap_err();
        assert!(matches!(
            e,
            ValidationError::UnknownDevice {
                device: DeviceId(4),
                ..
            }
        ));
        assert!(e.to_string().contains("0, 1, 2, 3"), "{e}");
        let e = cmd(&[("node-1", 1, true), ("node-1", 1, false)])
            .resolve(&t)
            .unwrap_err();
        assert_eq!(
            e,
            ValidationError::ConflictingTarget {
                node: "node-1".into(),
                device: DeviceId(1),
                rank: GlobalRank(5)
            }
        );
        // The two dies of one NPU told opposite sides.
        let e = cmd(&[("node-0", 3, true), ("node-0", 2, false)])
            .resolve(&t)
            .unwrap_err();
        assert_eq!(
            e,
            ValidationError::PartnerConflict {
                node: "node-0".into(),
                first: DeviceId(2),
                second: DeviceId(3)
            }
        );
        // Both the same way is a swap, which HCCL allows.
        assert!(cmd(&[("node-0", 3, true), ("node-0", 2, true)])
            .resolve(&t)
            .is_ok());
        // The same op twice is harmless and kept once.
        let p = cmd(&[("node-1", 1, true), ("node-1", 1, true)])
            .resolve(&t)
            .unwrap();
        assert_eq!(p.targets.len(), 1);
    }

    #[test]
    fn a_move_to_backup_needs_the_partner_die_in_the_job() {
        // node-0 has physical dies 0, 1 and 2: die 2's partner, 3, is not the job's.
        let slots = (0..3)
            .map(|d| crate::rank_table::RankSlot {
                node: "node-0".into(),
                device: DeviceId(d),
                rank: GlobalRank(d),
            })
            .collect();
        let t = RankTable::new(slots).unwrap();
        let e = cmd(&[("node-0", 1, true), ("node-0", 2, true)])
            .resolve(&t)
            .unwrap_err();
        assert_eq!(
            e,
            ValidationError::PartnerNotInJob {
                node: "node-0".into(),
                device: DeviceId(2),
                rank: GlobalRank(2),
                partner: DeviceId(3)
            }
        );
        let msg = e.to_string();
        assert!(
            msg.contains("node-0:2") && msg.contains("partner die node-0:3"),
            "{msg}"
        );
        // Its own NIC needs no partner; dies whose partner is in the job switch either way.
        assert!(cmd(&[("node-0", 2, false)]).resolve(&t).is_ok());
        assert!(cmd(&[("node-0", 0, true), ("node-0", 1, true)])
            .resolve(&t)
            .is_ok());
    }

    #[test]
    fn clusterd_form_checks_lengths_and_device_numbers() {
        let mut ops = BTreeMap::new();
        ops.insert(
            "node-0".to_string(),
            (vec!["0".to_string(), "8".to_string()], vec![true]),
        );
        assert_eq!(
            SwitchCommand::from_nic_ops("j".into(), None, &ops),
            Err(ValidationError::LengthMismatch {
                node: "node-0".into(),
                devs: 2,
                ops: 1
            })
        );
        ops.insert("node-0".to_string(), (vec!["zero".to_string()], vec![true]));
        assert!(matches!(
            SwitchCommand::from_nic_ops("j".into(), None, &ops),
            Err(ValidationError::BadDevice { .. })
        ));
        // ClusterD matches device ids as exact strings: " 8" names no device there either.
        for bad in [" 8", "8 ", "+8", "08"] {
            ops.insert("node-0".to_string(), (vec![bad.to_string()], vec![true]));
            let e = SwitchCommand::from_nic_ops("j".into(), None, &ops).unwrap_err();
            assert!(matches!(e, ValidationError::BadDevice { .. }), "{bad:?}");
            assert!(
                e.to_string().contains(&format!(
                    "{bad:?} of node \"node-0\" is not a device number"
                )),
                "{e}"
            );
        }
        ops.insert(
            "node-0".to_string(),
            (vec!["0".to_string(), "8".to_string()], vec![true, false]),
        );
        let c = SwitchCommand::from_nic_ops("j".into(), None, &ops).unwrap();
        assert_eq!(c.targets.len(), 2);
        assert_eq!(c.targets[1].device, DeviceId(8));
        assert!(!c.targets[1].use_backup);
    }
}
