//! The switch planner: how one rank turns a switch into HCCL calls.
//!
//! HCCL requires every member of a group to call `HcclCommWorkingDevNicSet` with identical
//! arguments, and every rank to visit shared groups in the same order. The plan depends only
//! on the targets and on each group's membership, never on which rank computes it, and groups
//! are visited sorted by name, so any two ranks agree on every group they share and on the
//! relative order of those groups.

use crate::hal::{GroupInfo, NicSide};
use crate::ids::{GlobalRank, GroupRank};
use serde::{Deserialize, Serialize};

/// One `HcclCommWorkingDevNicSet` call: `ranks[i]` (group ranks) move to `sides[i]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupCall {
    /// The group's name.
    pub group: String,
    /// The targets that are members of the group, as group ranks, in the operator's order.
    pub ranks: Vec<GroupRank>,
    /// The side each of `ranks` moves to.
    pub sides: Vec<NicSide>,
}

impl GroupCall {
    /// The `useBackup` array of HCCL's C signature, one flag per rank: the one place a call
    /// turns sides into flags, at the HAL boundary ([`crate::RankHal::set_working_nic`]).
    pub fn use_backup(&self) -> Vec<bool> {
        self.sides.iter().map(|s| s.use_backup()).collect()
    }

    /// A stable fingerprint of the call (FNV-1a 64 over name, ranks and `useBackup` flags, one
    /// byte each). Members of a group report it after a switch; the manager resumes only if
    /// they all agree. Workers of other builds compute it too: its bytes never change.
    pub fn digest(&self) -> u64 {
        let mut h = Fnv64::new();
        h.write(self.group.as_bytes());
        h.write(&[0xff]);
        h.write(&(self.ranks.len() as u32).to_le_bytes());
        for (r, side) in self.ranks.iter().zip(&self.sides) {
            h.write(&r.0.to_le_bytes());
            h.write(&[u8::from(side.use_backup())]);
        }
        h.finish()
    }
}

/// Plans the calls for one process. `targets` are `(global rank, side)` in the operator's
/// order; `groups` are the process's groups in any order.
///
/// Per group (sorted by name): the targets that are members, in target order, translated to
/// group ranks. Groups with no target are skipped.
pub fn plan_calls(groups: &[GroupInfo], targets: &[(GlobalRank, NicSide)]) -> Vec<GroupCall> {
    let mut sorted: Vec<&GroupInfo> = groups.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    sorted
        .into_iter()
        .filter_map(|g| {
            let (ranks, sides): (Vec<_>, Vec<_>) = targets
                .iter()
                .filter_map(|(r, side)| g.group_rank_of(*r).map(|gr| (gr, *side)))
                .unzip();
            (!ranks.is_empty()).then(|| GroupCall {
                group: g.name.clone(),
                ranks,
                sides,
            })
        })
        .collect()
}

/// FNV-1a, 64 bit: stable across processes, builds and platforms (unlike `DefaultHasher`).
struct Fnv64(u64);

impl Fnv64 {
    fn new() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn g(name: &str, members: &[u32]) -> GroupInfo {
        GroupInfo {
            name: name.into(),
            members: members.iter().map(|m| GlobalRank(*m)).collect(),
        }
    }

    #[test]
    fn translates_to_group_ranks_in_target_order_and_sorts_groups() {
        let groups = vec![
            g("world", &[0, 1, 2, 3]),
            g("dp_1", &[1, 3]),
            g("dp_0", &[0, 2]),
        ];
        let targets = [
            (GlobalRank(3), NicSide::Backup),
            (GlobalRank(1), NicSide::Primary),
        ];
        let calls = plan_calls(&groups, &targets);
        let sides = vec![NicSide::Backup, NicSide::Primary];
        assert_eq!(
            calls,
            vec![
                GroupCall {
                    group: "dp_1".into(),
                    ranks: vec![GroupRank(1), GroupRank(0)],
                    sides: sides.clone()
                },
                GroupCall {
                    group: "world".into(),
                    ranks: vec![GroupRank(3), GroupRank(1)],
                    sides
                },
            ]
        );
        assert_eq!(calls[0].use_backup(), vec![true, false]);
        // Workers of different builds compare digests: the bytes hashed never change.
        assert_eq!(calls[0].digest(), 0x49d7_ed1f_e900_18a0);
    }

    #[test]
    fn digest_depends_on_every_argument() {
        let base = GroupCall {
            group: "g".into(),
            ranks: vec![GroupRank(1), GroupRank(2)],
            sides: vec![NicSide::Backup, NicSide::Primary],
        };
        let mut flag = base.clone();
        flag.sides[1] = NicSide::Backup;
        let mut order = base.clone();
        order.ranks.reverse();
        let mut name = base.clone();
        name.group = "h".into();
        let d = base.digest();
        assert_ne!(d, flag.digest());
        assert_ne!(d, order.digest());
        assert_ne!(d, name.digest());
        assert_eq!(d, base.clone().digest());
    }

    /// A random job: `world` plus tp groups (consecutive chunks) and dp groups (strided),
    /// each process given its groups in a random order.
    fn job() -> impl Strategy<Value = (u32, u32, Vec<(u32, bool)>, u64)> {
        (1u32..6, 1u32..5).prop_flat_map(|(tp, dp)| {
            let world = tp * dp;
            (
                Just(tp),
                Just(dp),
                proptest::collection::vec((0..world, any::<bool>()), 0..8),
                any::<u64>(),
            )
        })
    }

    fn groups_of(rank: u32, tp: u32, dp: u32, shuffle: u64) -> Vec<GroupInfo> {
        let world: Vec<u32> = (0..tp * dp).collect();
        let t = rank / tp;
        let d = rank % tp;
        let tp_members: Vec<u32> = (t * tp..(t + 1) * tp).collect();
        let dp_members: Vec<u32> = (0..dp).map(|i| i * tp + d).collect();
        let mut v = vec![
            g("world", &world),
            g(&format!("tp_{t}"), &tp_members),
            g(&format!("dp_{d}"), &dp_members),
        ];
        v.rotate_left((shuffle.wrapping_add(rank as u64) % 3) as usize);
        v
    }

    proptest! {
        /// Every member of a group computes the identical call for it, and any two ranks
        /// visit the groups they share in the same relative order.
        #[test]
        fn members_agree_on_calls_and_order((tp, dp, targets, shuffle) in job()) {
            let targets: Vec<(GlobalRank, NicSide)> = targets
                .into_iter()
                .map(|(r, b)| (GlobalRank(r), NicSide::from_use_backup(b)))
                .collect();
            let mut per_group: BTreeMap<String, GroupCall> = BTreeMap::new();
            let mut sequences = Vec::new();
            for rank in 0..tp * dp {
                let calls = plan_calls(&groups_of(rank, tp, dp, shuffle), &targets);
                for c in &calls {
                    if let Some(prev) = per_group.get(&c.group) {
                        prop_assert_eq!(prev, c);
                    } else {
                        per_group.insert(c.group.clone(), c.clone());
                    }
                    prop_assert_eq!(c.ranks.len(), c.sides.len());
                    prop_assert!(!c.ranks.is_empty());
                }
                sequences.push(calls.into_iter().map(|c| c.group).collect::<Vec<_>>());
            }
            for a in &sequences {
                for b in &sequences {
                    let shared_a: Vec<_> = a.iter().filter(|x| b.contains(x)).collect();
                    let shared_b: Vec<_> = b.iter().filter(|x| a.contains(x)).collect();
                    prop_assert_eq!(shared_a, shared_b);
                }
            }
            // A group that contains a target is always called.
            if !targets.is_empty() {
                prop_assert!(per_group.contains_key("world"));
            }
        }
    }
}
