//! The job's rank table: which `(node, device)` runs which global rank.

use crate::ids::{DeviceId, GlobalRank, NodeName};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One rank's place in the job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankSlot {
    pub node: NodeName,
    pub device: DeviceId,
    pub rank: GlobalRank,
}

/// Errors building a rank table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RankTableError {
    #[error("rank {rank} is assigned twice: to {first_node}:{first_device} and to {second_node}:{second_device}")]
    DuplicateRank {
        rank: GlobalRank,
        first_node: NodeName,
        first_device: DeviceId,
        second_node: NodeName,
        second_device: DeviceId,
    },
    #[error("device {node}:{device} is listed twice")]
    DuplicateDevice { node: NodeName, device: DeviceId },
    #[error("the rank table is empty")]
    Empty,
    #[error("ranks must be 0..{count} without gaps, but rank {missing} is missing")]
    Gap { count: usize, missing: GlobalRank },
}

/// Bidirectional map between `(node, device)` and global rank. Nodes keep the order they were
/// given in (node index = position), which is the order the operator sees them in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankTable {
    slots: Vec<RankSlot>, // indexed by global rank
    nodes: Vec<NodeName>,
    by_node: BTreeMap<NodeName, BTreeMap<DeviceId, GlobalRank>>,
}

impl RankTable {
    /// Builds a table from explicit slots. Ranks must be exactly `0..n`.
    pub fn new(mut slots: Vec<RankSlot>) -> Result<Self, RankTableError> {
        if slots.is_empty() {
            return Err(RankTableError::Empty);
        }
        slots.sort_by_key(|s| s.rank);
        let mut nodes = Vec::new();
        let mut by_node: BTreeMap<NodeName, BTreeMap<DeviceId, GlobalRank>> = BTreeMap::new();
        for (i, s) in slots.iter().enumerate() {
            if s.rank.0 as usize != i {
                if i > 0 && slots[i - 1].rank == s.rank {
                    let p = &slots[i - 1];
                    return Err(RankTableError::DuplicateRank {
                        rank: s.rank,
                        first_node: p.node.clone(),
                        first_device: p.device,
                        second_node: s.node.clone(),
                        second_device: s.device,
                    });
                }
                return Err(RankTableError::Gap {
                    count: slots.len(),
                    missing: GlobalRank(i as u32),
                });
            }
            let devs = by_node.entry(s.node.clone()).or_insert_with(|| {
                nodes.push(s.node.clone());
                BTreeMap::new()
            });
            if devs.insert(s.device, s.rank).is_some() {
                return Err(RankTableError::DuplicateDevice {
                    node: s.node.clone(),
                    device: s.device,
                });
            }
        }
        Ok(RankTable {
            slots,
            nodes,
            by_node,
        })
    }

    /// The common layout: nodes `node-0..node-{n-1}`, devices `0..d`, `rank = node * d + device`.
    pub fn uniform(nodes: u32, devices_per_node: u32) -> Self {
        let names: Vec<NodeName> = (0..nodes).map(|i| NodeName(format!("node-{i}"))).collect();
        Self::uniform_named(&names, devices_per_node)
    }

    /// Like [`RankTable::uniform`] with the given node names, in rank order.
    pub fn uniform_named(nodes: &[NodeName], devices_per_node: u32) -> Self {
        let slots = nodes
            .iter()
            .enumerate()
            .flat_map(|(n, name)| {
                (0..devices_per_node).map(move |d| RankSlot {
                    node: name.clone(),
                    device: DeviceId(d),
                    rank: GlobalRank(n as u32 * devices_per_node + d),
                })
            })
            .collect();
        Self::new(slots).expect("a uniform layout is always valid")
    }

    pub fn rank_of(&self, node: &NodeName, device: DeviceId) -> Option<GlobalRank> {
        self.by_node.get(node)?.get(&device).copied()
    }

    pub fn slot(&self, rank: GlobalRank) -> Option<&RankSlot> {
        self.slots.get(rank.0 as usize)
    }

    pub fn has_node(&self, node: &NodeName) -> bool {
        self.by_node.contains_key(node)
    }

    /// Devices of a node with their ranks, in device order.
    pub fn devices_of(&self, node: &NodeName) -> impl Iterator<Item = (DeviceId, GlobalRank)> + '_ {
        self.by_node
            .get(node)
            .into_iter()
            .flat_map(|m| m.iter().map(|(d, r)| (*d, *r)))
    }

    /// Ranks of a node in device order.
    pub fn ranks_of(&self, node: &NodeName) -> Vec<GlobalRank> {
        self.devices_of(node).map(|(_, r)| r).collect()
    }

    /// Node names in the order they were given.
    pub fn nodes(&self) -> &[NodeName] {
        &self.nodes
    }

    pub fn slots(&self) -> &[RankSlot] {
        &self.slots
    }

    pub fn world_size(&self) -> usize {
        self.slots.len()
    }

    pub fn all_ranks(&self) -> impl Iterator<Item = GlobalRank> + '_ {
        self.slots.iter().map(|s| s.rank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_layout_maps_both_ways() {
        let t = RankTable::uniform(4, 16);
        assert_eq!(t.world_size(), 64);
        let r = t.rank_of(&"node-1".into(), DeviceId(8)).unwrap();
        assert_eq!(r, GlobalRank(24));
        let s = t.slot(r).unwrap();
        assert_eq!((s.node.0.as_str(), s.device), ("node-1", DeviceId(8)));
        assert_eq!(t.rank_of(&"node-4".into(), DeviceId(0)), None);
        assert_eq!(t.rank_of(&"node-0".into(), DeviceId(16)), None);
        assert_eq!(t.ranks_of(&"node-3".into()).len(), 16);
    }

    #[test]
    fn duplicate_and_gaps_are_refused() {
        let slot = |n: &str, d, r| RankSlot {
            node: n.into(),
            device: DeviceId(d),
            rank: GlobalRank(r),
        };
        assert!(matches!(
            RankTable::new(vec![slot("a", 0, 0), slot("a", 1, 0)]),
            Err(RankTableError::DuplicateRank { .. })
        ));
        assert!(matches!(
            RankTable::new(vec![slot("a", 0, 0), slot("a", 0, 1)]),
            Err(RankTableError::DuplicateDevice { .. })
        ));
        assert!(matches!(
            RankTable::new(vec![slot("a", 0, 0), slot("a", 1, 2)]),
            Err(RankTableError::Gap { .. })
        ));
        assert_eq!(RankTable::new(vec![]), Err(RankTableError::Empty));
    }
}
