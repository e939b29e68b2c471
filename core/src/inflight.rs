//! Aborting the collectives in flight and finishing the step: where every group's sequence of
//! collectives stood when its ranks aborted, and the point each group is redone from.
//!
//! A rank numbers the collectives it issues on each of its groups (0, 1, ...: every member
//! issues a group's collectives in the same order). When an operation aborts the collectives
//! in flight ([`crate::protocol::DirectiveKind::AbortInFlight`]), each rank reports, per group,
//! a [`CollectivePosition`]: how long the prefix of its sequence is that completed on this
//! rank, and how many it issued. [`agree`] turns every rank's report into one [`RedoPoint`] per
//! group: the first collective that did not complete on every member. Every member then issues
//! its collectives from there again, on the rebuilt group, with the inputs it kept.
//!
//! The rules [`agree`] keeps (checked by `tests/inflight_props.rs`):
//!
//! - nothing that completed on every member is redone: the redo point is the least
//!   `completed` of the members, so the collective before it completed everywhere;
//! - nothing is skipped: no member's completed prefix ends before the redo point, so every
//!   collective from it on is issued again by every member that had issued it;
//! - every member of a group reports it, with the same size, and no rank completed more than
//!   it issued; otherwise there is no point to agree on and the abort fails.

use crate::display::short_list;
use crate::ids::GlobalRank;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Where one group's sequence of collectives stands on one rank, as it aborted.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CollectivePosition {
    /// The group's name (the same on every member).
    pub group: String,
    /// The group's size: every member reports it.
    pub size: u32,
    /// The length of the completed prefix: collectives `0..completed` completed on this rank.
    pub completed: u64,
    /// How many collectives this rank issued on the group (`>= completed`).
    pub issued: u64,
}

/// The point one group's collectives are issued again from, on every member.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RedoPoint {
    /// The group's name.
    pub group: String,
    /// The first collective that did not complete on every member.
    pub from: u64,
}

/// Why the ranks' positions give no redo point.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RedoError {
    /// Members of a group did not all report it: a member that did not abort it may still be
    /// inside one of its collectives.
    #[error("group {group}: {reported} of {size} members reported where its collectives stand")]
    Incomplete {
        /// The group.
        group: String,
        /// Members that reported it.
        reported: usize,
        /// Its size.
        size: u32,
    },
    /// Members reported different sizes for a group.
    #[error("group {group}: members report sizes {sizes}")]
    SizeDisagrees {
        /// The group.
        group: String,
        /// The sizes reported.
        sizes: String,
    },
    /// A rank reported more collectives completed than issued, or a group twice.
    #[error("rank {rank} reported an impossible position on group {group}")]
    Impossible {
        /// The rank.
        rank: GlobalRank,
        /// The group.
        group: String,
    },
    /// A member completed less than another member issued past its own position by more
    /// than the sequence allows: ranks of one group are never a whole collective apart in
    /// the prefix they completed and the collectives another already finished (a member
    /// cannot complete collective `n` while a peer has not issued it).
    #[error(
        "group {group}: rank {ahead} completed {completed} collectives but rank {behind} \
         issued only {issued}"
    )]
    AheadOfIssue {
        /// The group.
        group: String,
        /// The rank whose completed prefix is longest.
        ahead: GlobalRank,
        /// Its completed prefix.
        completed: u64,
        /// A rank that issued fewer collectives than that.
        behind: GlobalRank,
        /// What it issued.
        issued: u64,
    },
}

/// Every rank's positions, one list per rank (sorted or not), into one redo point per group,
/// sorted by group name.
pub fn agree(
    reports: &BTreeMap<GlobalRank, Vec<CollectivePosition>>,
) -> Result<Vec<RedoPoint>, RedoError> {
    let mut groups: BTreeMap<&str, Vec<(GlobalRank, &CollectivePosition)>> = BTreeMap::new();
    for (rank, positions) in reports {
        let mut seen = BTreeSet::new();
        for p in positions {
            if p.completed > p.issued || !seen.insert(p.group.as_str()) {
                return Err(RedoError::Impossible {
                    rank: *rank,
                    group: p.group.clone(),
                });
            }
            groups.entry(&p.group).or_default().push((*rank, p));
        }
    }
    let mut out = Vec::with_capacity(groups.len());
    for (group, members) in groups {
        let sizes: BTreeSet<u32> = members.iter().map(|(_, p)| p.size).collect();
        if sizes.len() > 1 {
            return Err(RedoError::SizeDisagrees {
                group: group.to_owned(),
                sizes: short_list(&sizes),
            });
        }
        let size = members[0].1.size;
        if members.len() != size as usize {
            return Err(RedoError::Incomplete {
                group: group.to_owned(),
                reported: members.len(),
                size,
            });
        }
        // A collective completes on a rank only once every member issued it.
        let ahead = members.iter().max_by_key(|(_, p)| p.completed).copied();
        let behind = members.iter().min_by_key(|(_, p)| p.issued).copied();
        if let (Some((a, pa)), Some((b, pb))) = (ahead, behind) {
            if pa.completed > pb.issued {
                return Err(RedoError::AheadOfIssue {
                    group: group.to_owned(),
                    ahead: a,
                    completed: pa.completed,
                    behind: b,
                    issued: pb.issued,
                });
            }
        }
        let from = members.iter().map(|(_, p)| p.completed).min().unwrap_or(0);
        out.push(RedoPoint {
            group: group.to_owned(),
            from,
        });
    }
    Ok(out)
}

/// A training process's side of an in-flight move: its framework ends the collectives in
/// flight, rebuilds its groups with the move applied and issues them again from the redo
/// points, or gives them up. Implemented over the framework's callback (`taskd-capi`, the
/// Gloo switch of the Python package) and by the simulator's ranks; the worker calls it off
/// the training thread, which waits mid-step meanwhile.
pub trait InFlightFramework: Send + Sync {
    /// Ends every collective in flight on the groups `targets` moves (the old plane's
    /// connections) and says where each group's sequence stands. From now on, a collective
    /// that fails waits for [`InFlightFramework::switch`] instead of failing its caller, and a
    /// new one waits to be issued on the rebuilt group.
    fn abort(
        &self,
        targets: &[(GlobalRank, crate::hal::NicSide)],
    ) -> Result<Vec<CollectivePosition>, String>;

    /// Keeps `redo` for the switch the worker makes next through its HAL (the framework's
    /// switch call then rebuilds off the training thread and re-issues from there).
    fn arm_switch(&self, redo: Vec<RedoPoint>);

    /// The redo points armed by [`InFlightFramework::arm_switch`], taken (the HAL's switch call
    /// asks): `Some` when this switch is an in-flight one.
    fn take_switch(&self) -> Option<Vec<RedoPoint>>;

    /// Rebuilds the groups with `ranks[i]` on their backup NIC when `use_backup[i]`, then
    /// issues every group's collectives from its redo point again; the waiting training thread
    /// goes on. Within `timeout`.
    fn switch(
        &self,
        ranks: &[u32],
        use_backup: &[bool],
        redo: &[RedoPoint],
        timeout: std::time::Duration,
    ) -> Result<(), String>;

    /// The move failed: every waiting collective fails its caller with its own error (the
    /// recovery path of a failed collective), and collectives fail normally from now on.
    fn give_up(&self, reason: &str);
}

/// What one member re-issues of a group once it is rebuilt: `[from, issued)`, in order.
pub fn to_reissue(point: &RedoPoint, mine: &CollectivePosition) -> std::ops::Range<u64> {
    point.from.min(mine.issued)..mine.issued
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(group: &str, size: u32, completed: u64, issued: u64) -> CollectivePosition {
        CollectivePosition {
            group: group.into(),
            size,
            completed,
            issued,
        }
    }

    fn reports(
        list: &[(u32, Vec<CollectivePosition>)],
    ) -> BTreeMap<GlobalRank, Vec<CollectivePosition>> {
        list.iter()
            .map(|(r, p)| (GlobalRank(*r), p.clone()))
            .collect()
    }

    #[test]
    fn the_redo_point_is_the_first_collective_not_completed_everywhere() {
        // Rank 0 finished collective 5 (its ring part ended first) and issued 6; rank 1 is
        // still in 5.
        let r = reports(&[(0, vec![pos("0", 2, 6, 7)]), (1, vec![pos("0", 2, 5, 6)])]);
        let points = agree(&r).unwrap();
        assert_eq!(
            points,
            vec![RedoPoint {
                group: "0".into(),
                from: 5
            }]
        );
        assert_eq!(to_reissue(&points[0], &r[&GlobalRank(0)][0]), 5..7);
        assert_eq!(to_reissue(&points[0], &r[&GlobalRank(1)][0]), 5..6);
    }

    #[test]
    fn nothing_in_flight_redoes_nothing() {
        let r = reports(&[(0, vec![pos("0", 2, 4, 4)]), (1, vec![pos("0", 2, 4, 4)])]);
        let points = agree(&r).unwrap();
        assert_eq!(to_reissue(&points[0], &r[&GlobalRank(0)][0]), 4..4);
    }

    #[test]
    fn a_missing_member_or_an_impossible_report_gives_no_point() {
        let r = reports(&[(0, vec![pos("0", 2, 4, 4)])]);
        assert!(matches!(agree(&r), Err(RedoError::Incomplete { .. })));
        let r = reports(&[(0, vec![pos("0", 2, 5, 4)]), (1, vec![pos("0", 2, 4, 4)])]);
        assert!(matches!(agree(&r), Err(RedoError::Impossible { .. })));
        let r = reports(&[(0, vec![pos("0", 2, 4, 4)]), (1, vec![pos("0", 3, 4, 4)])]);
        assert!(matches!(agree(&r), Err(RedoError::SizeDisagrees { .. })));
        let r = reports(&[(0, vec![pos("0", 2, 6, 6)]), (1, vec![pos("0", 2, 4, 5)])]);
        assert!(matches!(agree(&r), Err(RedoError::AheadOfIssue { .. })));
    }
}
