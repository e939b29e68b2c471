//! HCCL's per-operator NIC rule, simulated.
//!
//! CANN documents for `HcclCommWorkingDevNicSet` that a NIC configuration set on a communicator
//! is kept only by operators the communicator had already issued: "later operators of the same
//! type and parameters keep the new NIC configuration; other newly issued operators use the
//! default NIC". HCCL builds an operator's transport links when the operator (its type and
//! parameters) is first issued, and the NIC-set call re-links the operators that exist.
//!
//! The simulator therefore keeps, per group member, two things:
//!
//! - the group's *set configuration*: which group ranks the NIC-set calls this member applied
//!   put on their backup NIC. It is what a worker reports in a verification round
//!   (`taskd_core::verify`), what [`crate::Fabric::ranks_on_backup`] reads and what the
//!   manager's NIC table must match;
//! - one configuration per [`Collective`] the member has issued on the group: the set
//!   configuration of the calls made *after* the operator was first issued, applied to the
//!   default (every rank on its primary NIC). An operator issued before a call carries the
//!   call's changes; an operator first issued after it starts on the default NIC.
//!
//! A collective runs on its operator's configuration. One that runs with a rank on its default
//! NIC while the group's set configuration has that rank on its backup NIC is counted
//! ([`crate::Fabric::collectives_on_default_nic`]): its traffic is on the NIC the operator
//! moved away from. That is HCCL's documented behaviour, not a disagreement: every member
//! issued the operator at the same point of the group's sequence, so every member holds the
//! same configuration for it, and the collective works as long as the default NIC's link does.
//!
//! **Consistent**, under this rule, means: (1) every live member of a group has applied the
//! same set configuration; (2) for every operator, every live member that has issued it holds
//! the same configuration for it; (3) every group of a rank agrees about that rank's side in
//! its set configuration. [`crate::Fabric::check_consistency`] checks all three. A collective
//! whose members hold different configurations for its operator is what hangs or corrupts
//! training on real hardware; the simulator fails it and counts it
//! ([`crate::Fabric::collectives_on_inconsistent_groups`]).
//!
//! A member keeps the training operator and the newest [`RETAINED_OPERATORS`] others: older
//! evaluations, which the simulated training never issues again, are forgotten (and so are out
//! of the consistency check), so a simulator serving for hours keeps flat memory.

use crate::view::BackupSet;
use std::collections::BTreeMap;
use std::fmt;

/// The type of a collective, as HCCL tells operators apart.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CollectiveKind {
    /// `HcclAllReduce`.
    AllReduce,
}

/// One operator: a collective's type and parameters. Two calls of the same operator share
/// HCCL's links and so their NIC configuration.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Collective {
    /// The collective's type.
    pub kind: CollectiveKind,
    /// Elements per call (the parameter the simulated training varies).
    pub elements: u64,
}

impl Collective {
    /// The gradient all-reduce every training step runs on every group.
    pub const TRAINING: Collective = Collective::all_reduce(1 << 20);

    /// An all-reduce of `elements` elements.
    pub const fn all_reduce(elements: u64) -> Self {
        Collective {
            kind: CollectiveKind::AllReduce,
            elements,
        }
    }

    /// The `n`-th evaluation's all-reduce (`n` from 1): of another size than training's, and of
    /// another size than every earlier evaluation's, so each is an operator the group has not
    /// issued before.
    pub const fn evaluation(n: u64) -> Self {
        Collective::all_reduce(4096 + n)
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            CollectiveKind::AllReduce => write!(f, "allreduce({})", self.elements),
        }
    }
}

/// One member's configuration of each operator it issued on a group: the group ranks on their
/// backup NIC ([`BackupSet`]).
pub(crate) type OperatorViews = BTreeMap<Collective, BackupSet>;

/// How many operators besides [`Collective::TRAINING`] a member keeps: issuing one more
/// retires the oldest evaluation. The simulated training never issues an evaluation's size
/// again, so a retired operator never runs; what the limit buys is memory that stays flat
/// while a simulator serves for hours (an evaluation every third step).
pub const RETAINED_OPERATORS: usize = 64;

/// The member issues `op`: a new operator starts on the default NIC (every rank primary).
pub(crate) fn issue(views: &mut OperatorViews, op: Collective) {
    if views.contains_key(&op) {
        return;
    }
    views.insert(op, BackupSet::default());
    let others = views.len() - usize::from(views.contains_key(&Collective::TRAINING));
    if others > RETAINED_OPERATORS {
        // Evaluations grow in size: the smallest other than training is the oldest.
        let oldest = views
            .keys()
            .copied()
            .find(|c| *c != Collective::TRAINING && *c != op);
        if let Some(oldest) = oldest {
            views.remove(&oldest);
        }
    }
}

/// A NIC-set call this member applied: every operator it has issued takes the change.
pub(crate) fn apply(views: &mut OperatorViews, group_rank: usize, use_backup: bool) {
    for v in views.values_mut() {
        v.set(group_rank, use_backup);
    }
}

/// Whether a collective of configuration `op_view` runs some rank on its default NIC that one
/// of the members' set configurations (`set_views`) has on its backup NIC.
pub(crate) fn on_default_nic<'a>(
    set_views: impl IntoIterator<Item = &'a BackupSet>,
    op_view: &BackupSet,
) -> bool {
    set_views
        .into_iter()
        .any(|set| set.iter().any(|gr| !op_view.contains(gr)))
}

/// What the members that issued one operator hold for it: `(member, configuration)`.
pub(crate) type Held = Vec<(usize, BackupSet)>;

/// Disagreements about operators between `live` members (indices into `per_member`): for every
/// operator some live member issued and its holders do not all agree on, what each holds.
pub(crate) fn disagreements(
    per_member: &[OperatorViews],
    live: &[usize],
) -> Vec<(Collective, Held)> {
    let mut ops: BTreeMap<Collective, Vec<(usize, &BackupSet)>> = BTreeMap::new();
    for m in live {
        for (op, v) in &per_member[*m] {
            ops.entry(*op).or_default().push((*m, v));
        }
    }
    ops.into_iter()
        .filter(|(_, held)| held.iter().any(|(_, v)| *v != held[0].1))
        .map(|(op, held)| {
            let held = held.into_iter().map(|(m, v)| (m, v.clone())).collect();
            (op, held)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(on: &[usize]) -> BackupSet {
        let mut v = BackupSet::default();
        for gr in on {
            v.set(*gr, true);
        }
        v
    }

    #[test]
    fn operators_issued_before_a_call_take_it_and_later_ones_start_on_the_default_nic() {
        let mut member = OperatorViews::new();
        issue(&mut member, Collective::TRAINING);
        apply(&mut member, 0, true);
        issue(&mut member, Collective::evaluation(1));
        // Issuing an operator again keeps its configuration.
        issue(&mut member, Collective::TRAINING);
        assert_eq!(member[&Collective::TRAINING], set(&[0]));
        assert_eq!(member[&Collective::evaluation(1)], set(&[]));
        let sets = [set(&[0])];
        assert!(on_default_nic(&sets, &member[&Collective::evaluation(1)]));
        assert!(!on_default_nic(&sets, &member[&Collective::TRAINING]));
        // A later call reaches every operator issued by then.
        apply(&mut member, 1, true);
        assert_eq!(member[&Collective::evaluation(1)], set(&[1]));
        assert_eq!(Collective::evaluation(2).to_string(), "allreduce(4098)");
        assert_ne!(Collective::evaluation(1), Collective::TRAINING);
    }

    #[test]
    fn a_member_keeps_training_and_the_newest_evaluations() {
        let mut member = OperatorViews::new();
        issue(&mut member, Collective::TRAINING);
        for n in 1..=(RETAINED_OPERATORS as u64 + 10) {
            issue(&mut member, Collective::evaluation(n));
        }
        assert_eq!(member.len(), RETAINED_OPERATORS + 1);
        assert!(member.contains_key(&Collective::TRAINING));
        assert!(!member.contains_key(&Collective::evaluation(10)));
        assert!(member.contains_key(&Collective::evaluation(11)));
        assert!(member.contains_key(&Collective::evaluation(RETAINED_OPERATORS as u64 + 10)));
    }

    #[test]
    fn members_disagree_only_about_an_operator_they_both_issued_differently() {
        let mut a = OperatorViews::new();
        let mut b = OperatorViews::new();
        issue(&mut a, Collective::TRAINING);
        issue(&mut b, Collective::TRAINING);
        issue(&mut a, Collective::evaluation(1)); // b has not issued it: no disagreement
        assert!(disagreements(&[a.clone(), b.clone()], &[0, 1]).is_empty());
        apply(&mut a, 1, true);
        let d = disagreements(&[a.clone(), b.clone()], &[0, 1]);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].0, Collective::TRAINING);
        assert_eq!(d[0].1, vec![(0, set(&[1])), (1, set(&[]))]);
        // A member that is not live does not count.
        assert!(disagreements(&[a, b], &[1]).is_empty());
    }
}
