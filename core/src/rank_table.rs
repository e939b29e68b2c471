//! The job's rank table: which `(node, device)` runs which global rank. Devices are the
//! physical ids of HCCL's rank table (`device_id`, `/dev/davinciN`; see [`DeviceId`]), never a
//! container's logical renumbering.
//!
//! Every table is built through [`RankTable::new`] (or [`RankTable::try_uniform`]), which
//! enforces the largest job taskd manages: [`MAX_RANKS`] ranks on at most [`MAX_NODES`] nodes,
//! device numbers below [`MAX_RANKS`]. The manager keeps per-rank state for the whole job, so a
//! bound here is what keeps a mistyped size from growing memory until the process is killed.

use crate::ids::{DeviceId, GlobalRank, NodeName};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The most ranks (training processes) in one job: 65,536, e.g. 4,096 nodes of 16 NPUs.
pub const MAX_RANKS: usize = 65_536;

/// The most nodes in one job.
pub const MAX_NODES: usize = 4_096;

/// The longest node name: a host name's length. Names are printed in every log line and
/// message about a node and travel in every registration, so a table that names a node with
/// a megabyte is refused rather than carried.
pub const MAX_NODE_NAME: usize = 255;

/// One rank's place in the job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankSlot {
    /// The node, by the name operators and proxies use.
    pub node: NodeName,
    /// The die's physical id on that node.
    pub device: DeviceId,
    /// The training process's global rank.
    pub rank: GlobalRank,
}

/// Errors building a rank table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RankTableError {
    /// Two slots claim one rank; both places are named, since either may be the typo.
    #[error("rank {rank} is assigned twice: to {first_node}:{first_device} and to {second_node}:{second_device}")]
    DuplicateRank {
        /// The rank claimed twice.
        rank: GlobalRank,
        /// Node of the first slot (in rank order) claiming it.
        first_node: NodeName,
        /// Device of the first slot claiming it.
        first_device: DeviceId,
        /// Node of the second slot claiming it.
        second_node: NodeName,
        /// Device of the second slot claiming it.
        second_device: DeviceId,
    },
    /// One die is given two ranks: two processes cannot share an NPU die.
    #[error("device {node}:{device} is listed twice")]
    DuplicateDevice {
        /// The node of the die.
        node: NodeName,
        /// The die listed twice.
        device: DeviceId,
    },
    /// No slot at all.
    #[error("the rank table is empty")]
    Empty,
    /// Ranks skip a number: HCCL numbers the world `0..n`, so a gap means a lost entry.
    #[error("ranks must be 0..{count} without gaps, but rank {missing} is missing")]
    Gap {
        /// How many slots there are (so the ranks must be `0..count`).
        count: usize,
        /// The lowest rank with no slot.
        missing: GlobalRank,
    },
    /// More ranks than [`MAX_RANKS`].
    #[error("{ranks} ranks is more than the largest job taskd manages ({max} ranks)")]
    TooManyRanks {
        /// The size asked for (`u64`: `nodes x devices` may overflow a `u32`).
        ranks: u64,
        /// [`MAX_RANKS`].
        max: usize,
    },
    /// More nodes than [`MAX_NODES`].
    #[error("{nodes} nodes is more than the largest job taskd manages ({max} nodes)")]
    TooManyNodes {
        /// The number of distinct nodes asked for.
        nodes: u64,
        /// [`MAX_NODES`].
        max: usize,
    },
    /// A device number no node has (at least [`MAX_RANKS`]): a mistyped id.
    #[error("device {node}:{device} is numbered above the largest device number ({max})")]
    DeviceOutOfRange {
        /// The node of the slot.
        node: NodeName,
        /// The out-of-range device id.
        device: DeviceId,
        /// The largest device id accepted.
        max: usize,
    },
    /// A node name that is longer than [`MAX_NODE_NAME`] or holds a character that is not
    /// printable (a newline would split every log line about the node).
    #[error("node name {shown} is not usable: {why}")]
    BadNodeName {
        /// The name as it can be shown (quoted, cut after 40 characters).
        shown: String,
        /// What is wrong with it.
        why: String,
    },
    /// [`RankTable::try_uniform`] with zero nodes or zero devices per node.
    #[error(
        "a job needs at least one node and one device per node (got {nodes} x {devices_per_node})"
    )]
    ZeroSize {
        /// Nodes asked for.
        nodes: u32,
        /// Devices per node asked for.
        devices_per_node: u32,
    },
}

/// Refuses a node name longer than [`MAX_NODE_NAME`] or with a character that is not
/// printable.
fn check_node_name(node: &NodeName) -> Result<(), RankTableError> {
    let name = &node.0;
    let why = if name.len() > MAX_NODE_NAME {
        format!("{} bytes, more than {MAX_NODE_NAME}", name.len())
    } else if let Some(c) = name.chars().find(|c| c.is_control()) {
        format!("it holds the control character {c:?}")
    } else {
        return Ok(());
    };
    let mut shown: String = name.chars().take(40).collect();
    if shown.len() < name.len() {
        shown.push_str("...");
    }
    Err(RankTableError::BadNodeName {
        shown: format!("{shown:?}"),
        why,
    })
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
    /// Builds a table from explicit slots. Ranks must be exactly `0..n`, with at most
    /// [`MAX_RANKS`] ranks on at most [`MAX_NODES`] nodes.
    pub fn new(mut slots: Vec<RankSlot>) -> Result<Self, RankTableError> {
        if slots.is_empty() {
            return Err(RankTableError::Empty);
        }
        if slots.len() > MAX_RANKS {
            return Err(RankTableError::TooManyRanks {
                ranks: slots.len() as u64,
                max: MAX_RANKS,
            });
        }
        slots.sort_by_key(|s| s.rank);
        let mut names = BTreeSet::new();
        for s in &slots {
            if names.insert(&s.node) {
                check_node_name(&s.node)?;
            }
        }
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
            if s.device.0 as usize >= MAX_RANKS {
                return Err(RankTableError::DeviceOutOfRange {
                    node: s.node.clone(),
                    device: s.device,
                    max: MAX_RANKS - 1,
                });
            }
            if !by_node.contains_key(&s.node) && nodes.len() == MAX_NODES {
                return Err(RankTableError::TooManyNodes {
                    nodes: slots.iter().map(|s| &s.node).collect::<BTreeSet<_>>().len() as u64,
                    max: MAX_NODES,
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
    ///
    /// # Panics
    ///
    /// When the size is zero or above the maximum; use [`RankTable::try_uniform`] for sizes
    /// that come from outside.
    pub fn uniform(nodes: u32, devices_per_node: u32) -> Self {
        Self::try_uniform(nodes, devices_per_node).expect("a uniform layout of a valid size")
    }

    /// [`RankTable::uniform`], refusing a zero size or one above [`MAX_NODES`] /
    /// [`MAX_RANKS`] before allocating anything.
    pub fn try_uniform(nodes: u32, devices_per_node: u32) -> Result<Self, RankTableError> {
        if nodes == 0 || devices_per_node == 0 {
            return Err(RankTableError::ZeroSize {
                nodes,
                devices_per_node,
            });
        }
        if nodes as usize > MAX_NODES {
            return Err(RankTableError::TooManyNodes {
                nodes: nodes.into(),
                max: MAX_NODES,
            });
        }
        let ranks = u64::from(nodes) * u64::from(devices_per_node);
        if ranks > MAX_RANKS as u64 {
            return Err(RankTableError::TooManyRanks {
                ranks,
                max: MAX_RANKS,
            });
        }
        let names: Vec<NodeName> = (0..nodes).map(NodeName::uniform).collect();
        Self::new(Self::uniform_slots(&names, devices_per_node))
    }

    /// Like [`RankTable::uniform`] with the given node names, in rank order.
    ///
    /// # Panics
    ///
    /// Like [`RankTable::uniform`].
    pub fn uniform_named(nodes: &[NodeName], devices_per_node: u32) -> Self {
        Self::new(Self::uniform_slots(nodes, devices_per_node))
            .expect("a uniform layout of a valid size")
    }

    fn uniform_slots(nodes: &[NodeName], devices_per_node: u32) -> Vec<RankSlot> {
        nodes
            .iter()
            .enumerate()
            .flat_map(|(n, name)| {
                (0..devices_per_node).map(move |d| RankSlot {
                    node: name.clone(),
                    device: DeviceId(d),
                    rank: GlobalRank(n as u32 * devices_per_node + d),
                })
            })
            .collect()
    }

    /// The rank on `device` of `node`: how an operator's `node:device` target becomes the
    /// rank the workers know. `None` when the table has no such die.
    pub fn rank_of(&self, node: &NodeName, device: DeviceId) -> Option<GlobalRank> {
        self.by_node.get(node)?.get(&device).copied()
    }

    /// Where `rank` runs; `None` beyond the world size.
    pub fn slot(&self, rank: GlobalRank) -> Option<&RankSlot> {
        self.slots.get(rank.0 as usize)
    }

    /// Whether `node` runs any rank of the job.
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

    /// Every slot, indexed by global rank.
    pub fn slots(&self) -> &[RankSlot] {
        &self.slots
    }

    /// The number of ranks (`n`, with ranks `0..n`).
    pub fn world_size(&self) -> usize {
        self.slots.len()
    }

    /// `0..n` as ranks, ascending.
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
    fn node_names_that_would_split_a_log_line_or_carry_a_megabyte_are_refused() {
        let table = |name: &str| {
            RankTable::new(vec![RankSlot {
                node: name.into(),
                device: DeviceId(0),
                rank: GlobalRank(0),
            }])
        };
        let e = table("node-1\nINFO forged").unwrap_err();
        assert!(matches!(e, RankTableError::BadNodeName { .. }), "{e:?}");
        assert!(e.to_string().contains("control character '\\n'"), "{e}");
        let huge = "n".repeat(1 << 20);
        let e = table(&huge).unwrap_err().to_string();
        assert!(e.contains("1048576 bytes, more than 255"), "{e}");
        assert!(
            e.len() < 200,
            "the message does not carry the name: {}",
            e.len()
        );
        assert!(table(&"n".repeat(MAX_NODE_NAME)).is_ok());
        assert!(table("10.0.0.1").is_ok() && table("节点-1").is_ok());
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

    #[test]
    fn sizes_above_the_maximum_are_refused_before_allocating() {
        let e = RankTable::try_uniform(1_000_000, 1_000_000).unwrap_err();
        assert_eq!(
            e,
            RankTableError::TooManyNodes {
                nodes: 1_000_000,
                max: MAX_NODES
            }
        );
        let e = RankTable::try_uniform(4_096, 17).unwrap_err();
        assert_eq!(
            e.to_string(),
            "69632 ranks is more than the largest job taskd manages (65536 ranks)"
        );
        assert!(matches!(
            RankTable::try_uniform(0, 16),
            Err(RankTableError::ZeroSize { .. })
        ));
        assert!(matches!(
            RankTable::try_uniform(3, 0),
            Err(RankTableError::ZeroSize { .. })
        ));
        assert_eq!(
            RankTable::try_uniform(4_096, 16).unwrap().world_size(),
            MAX_RANKS
        );
        assert_eq!(
            RankTable::try_uniform(1, 65_536).unwrap().world_size(),
            MAX_RANKS
        );
        let slot = |n: String, d, r| RankSlot {
            node: NodeName(n),
            device: DeviceId(d),
            rank: GlobalRank(r),
        };
        let many: Vec<RankSlot> = (0..=MAX_NODES as u32)
            .map(|i| slot(format!("n{i}"), 0, i))
            .collect();
        assert!(matches!(
            RankTable::new(many),
            Err(RankTableError::TooManyNodes { nodes: 4097, .. })
        ));
        assert!(matches!(
            RankTable::new(vec![slot("a".into(), 70_000, 0)]),
            Err(RankTableError::DeviceOutOfRange { .. })
        ));
    }
}
