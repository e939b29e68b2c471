//! The verification round: how a manager learns the truth about a job it did not watch.
//!
//! A manager that starts (first start or restart), a job that lost a process, and an operator's
//! recovery all need the same answer: which NIC configuration every rank has applied to every
//! group, and whether any gate is held for an operation nobody runs any more. The manager asks
//! every rank ([`DirectiveKind::Verify`]); each answers with a [`WorkerReport`]; [`assess`]
//! turns the answers into one [`Assessment`].
//!
//! The rules the manager then follows (the recovery contract, docs/recovery.md):
//!
//! - Every group agrees (every member reported the same members on backup, and every rank is on
//!   the same side in each of its groups): the NIC table is rebuilt from the reports, gates held
//!   for an orphaned operation are opened ([`DirectiveKind::Resume`] under that operation's id)
//!   and the job is `running`.
//! - Some group disagrees: nothing is opened. The job is `paused` if any gate holds (resuming
//!   onto disagreeing groups hangs or corrupts training) and `needs_recovery` otherwise; the
//!   assessment names the groups and ranks, and only an operator's `recover` moves on.
//! - A rank does not answer before the deadline: the job stays as it was declared and the round
//!   is repeated when the rank registers again.
//!
//! [`Verification`] is the round as a pure machine, driven by the ledger like an operation.
//!
//! **What a report describes.** A rank reports, per group, the members the NIC-set calls it
//! applied put on their backup NIC: the group's *set* configuration. HCCL applies such a call
//! to the operators the communicator had issued by then; an operator (a collective type and
//! its parameters) first issued later runs on the default NIC (CANN's
//! `HcclCommWorkingDevNicSet` documentation). Every member issues a group's operators in the
//! same order, so members that agree on the set configuration also agree on every operator's
//! configuration: a new operator on the default NIC is not a disagreement, and a round neither
//! reports nor needs to report it. `hal-mock/src/operator.rs` writes the rule down and defines
//! "consistent" under it; the simulator counts collectives that ran on the default NIC of a
//! switched group apart from disagreements.

pub use crate::assessment::{
    Assessment, Disagreement, DisagreementKind, VerifyReport, REFUSED_ASK_AGAIN,
};
use crate::display::short_list;
use crate::ids::{GlobalRank, OperationId};
use crate::operation::Action;
use crate::protocol::{Directive, DirectiveKind, NodeReply, Phase, ReplyBody, WorkerReport};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Deadline tokens of verification rounds live above this, apart from an operation's.
const TOKEN_BASE: u64 = 1 << 40;

/// Judges the reports of every rank. Groups are compared across their members; each rank's
/// side is compared across its groups. Pure and total: any set of reports gives an answer.
pub fn assess(reports: &BTreeMap<GlobalRank, WorkerReport>) -> Assessment {
    let mut a = Assessment::default();
    let mut groups: BTreeMap<&str, GroupViews> = BTreeMap::new();
    for (rank, report) in reports {
        a.disagreements.extend(sides_across_groups(*rank, report));
        a.disagreements.extend(unsettled(*rank, report));
        for v in &report.groups {
            let e = groups.entry(v.group.as_str()).or_default();
            e.size = e.size.max(v.size);
            e.views
                .entry(v.on_backup.as_slice())
                .or_default()
                .push(*rank);
        }
        if let Some(op) = report.gate.op {
            a.gates.entry(op).or_default().push(*rank);
        }
        if report.gate.held_after.is_some() {
            a.held.push(*rank);
        }
    }
    for (group, g) in &groups {
        a.on_backup
            .extend(g.views.keys().flat_map(|v| v.iter().copied()));
        a.disagreements.extend(g.judge(group));
    }
    a
}

/// What the members of one group reported: the largest size any of them gave, and which
/// members reported each view (the members on backup).
#[derive(Default)]
struct GroupViews<'a> {
    size: u32,
    views: BTreeMap<&'a [GlobalRank], Vec<GlobalRank>>,
}

impl GroupViews<'_> {
    /// `None` when every member reported one view.
    fn judge(&self, group: &str) -> Option<Disagreement> {
        let reporters: Vec<GlobalRank> = self
            .views
            .values()
            .flatten()
            .copied()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if self.views.len() > 1 {
            let detail = self
                .views
                .iter()
                .map(|(v, rs)| {
                    let side = if v.is_empty() {
                        "none on backup".to_string()
                    } else {
                        format!("backup = {}", short_list(v.iter()))
                    };
                    format!("ranks {} say {side}", short_list(rs))
                })
                .collect::<Vec<_>>()
                .join("; ");
            // On backup in some view and not in all.
            let union: BTreeSet<GlobalRank> =
                self.views.keys().flat_map(|v| v.iter().copied()).collect();
            let in_doubt = union
                .into_iter()
                .filter(|r| !self.views.keys().all(|v| v.contains(r)))
                .collect();
            return Some(Disagreement {
                group: group.to_string(),
                ranks: reporters,
                in_doubt,
                detail,
                kind: DisagreementKind::Views,
            });
        }
        (reporters.len() < self.size as usize).then(|| Disagreement {
            group: group.to_string(),
            detail: format!(
                "only {} of {} members reported the group",
                reporters.len(),
                self.size
            ),
            ranks: reporters,
            // Every member agrees on the sides: nothing a re-statement could fix (a group of
            // another size is a process started with another layout).
            in_doubt: Vec::new(),
            kind: DisagreementKind::Partial,
        })
    }
}

/// A rank whose last NIC-set call on a group failed cannot vouch for the group: its targets are
/// in doubt until a call on the group succeeds (a recovery re-states them).
fn unsettled(rank: GlobalRank, report: &WorkerReport) -> impl Iterator<Item = Disagreement> + '_ {
    report
        .groups
        .iter()
        .filter(|v| !v.unsettled.is_empty())
        .map(move |v| Disagreement {
            group: v.group.clone(),
            ranks: vec![rank],
            in_doubt: v.unsettled.clone(),
            detail: format!(
                "rank {rank}'s last NIC-set call on it failed; the side of ranks {} is not known",
                short_list(v.unsettled.iter())
            ),
            kind: DisagreementKind::Unsettled,
        })
}

/// A rank is a member of each group it reports: its side must be the same in all.
fn sides_across_groups(rank: GlobalRank, report: &WorkerReport) -> Option<Disagreement> {
    let (on, off): (Vec<_>, Vec<_>) = report
        .groups
        .iter()
        .partition(|v| v.on_backup.contains(&rank));
    if on.is_empty() || off.is_empty() {
        return None;
    }
    let on: Vec<&str> = on.iter().map(|v| v.group.as_str()).collect();
    let off: Vec<&str> = off.iter().map(|v| v.group.as_str()).collect();
    Some(Disagreement {
        group: format!("{} / {}", on.join(","), off.join(",")),
        ranks: vec![rank],
        in_doubt: vec![rank],
        detail: format!(
            "rank {rank} is on its backup NIC in {} but on its primary in {}",
            on.join(", "),
            off.join(", ")
        ),
        kind: DisagreementKind::SidesAcrossGroups,
    })
}

/// One verification round in flight.
#[derive(Clone, Debug)]
pub struct Verification {
    id: OperationId,
    all: BTreeSet<GlobalRank>,
    pending: BTreeSet<GlobalRank>,
    reports: BTreeMap<GlobalRank, WorkerReport>,
    /// Ranks that answered the query with a failure: they stay unreported, but the round does
    /// not wait its deadline for them.
    refused: BTreeSet<GlobalRank>,
    deadline: Duration,
    token: u64,
    stage: Stage,
    assessment: Option<Assessment>,
    started: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Stage {
    /// Waiting for every rank's report.
    Collect,
    /// Opening the gates held for `op` (one orphaned operation at a time).
    Release {
        op: OperationId,
        rest: Vec<OperationId>,
    },
    Done,
}

/// What a verification round asks of the runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VerifyStep {
    /// Carry out these (broadcasts and deadlines only).
    Act(Vec<Action>),
    /// The round is over.
    Done(VerifyReport),
}

impl Verification {
    /// Starts a round over `ranks` (every registered rank of the job), each to answer within
    /// `deadline`.
    pub fn start(
        id: OperationId,
        ranks: impl IntoIterator<Item = GlobalRank>,
        deadline: Duration,
        now: Duration,
    ) -> (Verification, Vec<Action>) {
        let all: BTreeSet<GlobalRank> = ranks.into_iter().collect();
        let mut v = Verification {
            id,
            pending: all.clone(),
            all,
            reports: BTreeMap::new(),
            refused: BTreeSet::new(),
            deadline,
            token: TOKEN_BASE,
            stage: Stage::Collect,
            assessment: None,
            started: now,
        };
        let actions = v.broadcast(DirectiveKind::Verify, id, now);
        (v, actions)
    }

    /// The round's id (also the directive's operation id).
    pub fn id(&self) -> OperationId {
        self.id
    }

    /// The phase the round is in: [`Phase::Verify`], or [`Phase::Resume`] while it opens
    /// orphaned gates.
    pub fn phase(&self) -> Phase {
        match self.stage {
            Stage::Release { .. } => Phase::Resume,
            _ => Phase::Verify,
        }
    }

    /// Ranks the round still waits for.
    pub fn pending(&self) -> &BTreeSet<GlobalRank> {
        &self.pending
    }

    fn broadcast(&mut self, kind: DirectiveKind, op: OperationId, now: Duration) -> Vec<Action> {
        self.token += 1;
        self.pending = self.all.clone();
        vec![
            Action::Broadcast(Directive { op, kind }),
            Action::ArmDeadline {
                token: self.token,
                phase: self.phase(),
                at: now + self.deadline,
            },
        ]
    }

    /// Replies from one node.
    pub fn on_replies(&mut self, nr: NodeReply, now: Duration) -> Option<VerifyStep> {
        let expected = match &self.stage {
            Stage::Collect => (self.id, Phase::Verify),
            Stage::Release { op, .. } => (*op, Phase::Resume),
            Stage::Done => return None,
        };
        for r in nr.replies {
            if (r.op, r.phase) != expected || !self.pending.contains(&r.rank) {
                continue;
            }
            match r.body {
                ReplyBody::Verified(report) if expected.1 == Phase::Verify => {
                    self.pending.remove(&r.rank);
                    self.reports.insert(r.rank, report);
                }
                ReplyBody::Resumed { .. } if expected.1 == Phase::Resume => {
                    self.pending.remove(&r.rank);
                }
                // A rank that cannot report now (its HAL not set up yet) is not waited for:
                // the round ends as soon as every other rank answered, naming it.
                ReplyBody::Failed(_) if expected.1 == Phase::Verify => {
                    self.refused.insert(r.rank);
                }
                // Anything else stays pending: the deadline names it.
                _ => {}
            }
        }
        if self.stage == Stage::Collect
            && !self.refused.is_empty()
            && self.pending.is_subset(&self.refused)
        {
            let missing = self.pending.iter().copied().collect();
            return Some(VerifyStep::Done(self.finish(missing, now)));
        }
        self.advance(now)
    }

    /// A rank is gone: the round cannot establish anything about it.
    pub fn on_lost(&mut self, rank: GlobalRank, now: Duration) -> Option<VerifyStep> {
        if self.stage == Stage::Done || !self.all.contains(&rank) {
            return None;
        }
        Some(VerifyStep::Done(self.finish(vec![rank], now)))
    }

    /// A deadline fired.
    pub fn on_deadline(&mut self, token: u64, now: Duration) -> Option<VerifyStep> {
        if token != self.token || self.stage == Stage::Done {
            return None;
        }
        let missing = self.pending.iter().copied().collect();
        Some(VerifyStep::Done(self.finish(missing, now)))
    }

    fn advance(&mut self, now: Duration) -> Option<VerifyStep> {
        if !self.pending.is_empty() {
            return None;
        }
        let next = match std::mem::replace(&mut self.stage, Stage::Done) {
            Stage::Collect => {
                let a = assess(&self.reports);
                // Gates are opened only onto groups that agree.
                let orphans: Vec<OperationId> = if a.consistent() {
                    a.gates.keys().copied().collect()
                } else {
                    Vec::new()
                };
                self.assessment = Some(a);
                orphans
            }
            Stage::Release { rest, .. } => rest,
            Stage::Done => return None,
        };
        let mut rest = next.into_iter();
        match rest.next() {
            Some(op) => {
                self.stage = Stage::Release {
                    op,
                    rest: rest.collect(),
                };
                Some(VerifyStep::Act(self.broadcast(
                    DirectiveKind::Resume,
                    op,
                    now,
                )))
            }
            None => Some(VerifyStep::Done(self.finish(Vec::new(), now))),
        }
    }

    fn finish(&mut self, missing: Vec<GlobalRank>, now: Duration) -> VerifyReport {
        self.stage = Stage::Done;
        let released = self
            .assessment
            .as_ref()
            .filter(|a| a.consistent() && missing.is_empty())
            .map(|a| a.gates.keys().copied().collect())
            .unwrap_or_default();
        VerifyReport {
            id: self.id,
            assessment: self.assessment.clone().or_else(|| {
                // A partial view still says what the answering ranks reported.
                (!self.reports.is_empty()).then(|| assess(&self.reports))
            }),
            refused: missing
                .iter()
                .copied()
                .filter(|r| self.refused.contains(r))
                .collect(),
            missing,
            released,
            took: now.saturating_sub(self.started),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job_state::JobState;
    use crate::protocol::{GateReport, GroupView};

    fn r(v: &[u32]) -> Vec<GlobalRank> {
        v.iter().map(|x| GlobalRank(*x)).collect()
    }

    fn view(group: &str, size: u32, backup: &[u32]) -> GroupView {
        GroupView {
            group: group.into(),
            size,
            on_backup: r(backup),
            unsettled: Vec::new(),
        }
    }

    fn report(groups: Vec<GroupView>) -> WorkerReport {
        WorkerReport {
            groups,
            gate: GateReport::default(),
        }
    }

    #[test]
    fn agreeing_groups_rebuild_the_table() {
        let mut m = BTreeMap::new();
        for rank in 0..4 {
            m.insert(
                GlobalRank(rank),
                report(vec![
                    view("world", 4, &[1]),
                    view(
                        if rank < 2 { "tp_0" } else { "tp_1" },
                        2,
                        if rank < 2 { &[1] } else { &[] },
                    ),
                ]),
            );
        }
        let a = assess(&m);
        assert!(a.consistent(), "{:?}", a.disagreements);
        assert_eq!(a.on_backup.iter().copied().collect::<Vec<_>>(), r(&[1]));
        assert_eq!(a.job_state(), JobState::Running);
    }

    #[test]
    fn a_member_with_another_view_is_named() {
        let mut m = BTreeMap::new();
        m.insert(GlobalRank(0), report(vec![view("world", 3, &[2])]));
        m.insert(GlobalRank(1), report(vec![view("world", 3, &[2])]));
        let mut held = report(vec![view("world", 3, &[])]);
        held.gate.held_after = Some(7);
        m.insert(GlobalRank(2), held);
        let a = assess(&m);
        assert_eq!(a.disagreements.len(), 1);
        assert_eq!(a.disagreements[0].group, "world");
        // Ranks 0 to 2 reported; only rank 2's side is in doubt.
        assert_eq!(a.disagreements[0].ranks, r(&[0, 1, 2]));
        assert_eq!(a.disagreements[0].in_doubt, r(&[2]));
        assert!(
            a.disagreements[0]
                .detail
                .contains("ranks 2 say none on backup"),
            "{}",
            a.disagreements[0].detail
        );
        assert_eq!(a.job_state(), JobState::Paused);
    }

    #[test]
    fn a_failed_call_leaves_its_targets_in_doubt() {
        let mut m = BTreeMap::new();
        m.insert(GlobalRank(0), report(vec![view("world", 2, &[1])]));
        let mut failed = report(vec![view("world", 2, &[1])]);
        failed.groups[0].unsettled = r(&[1]);
        m.insert(GlobalRank(1), failed);
        let a = assess(&m);
        assert!(!a.consistent());
        assert_eq!(a.ranks_in_doubt().into_iter().collect::<Vec<_>>(), r(&[1]));
        assert!(a.disagreements[0]
            .detail
            .contains("last NIC-set call on it failed"));
    }

    fn answers(id: OperationId, bodies: Vec<(u32, ReplyBody)>) -> NodeReply {
        NodeReply {
            node: crate::NodeName("node-0".into()),
            op: id,
            phase: Phase::Verify,
            replies: bodies
                .into_iter()
                .map(|(rank, body)| crate::protocol::RankReply {
                    rank: GlobalRank(rank),
                    op: id,
                    phase: Phase::Verify,
                    body,
                })
                .collect(),
            health: Vec::new(),
        }
    }

    #[test]
    fn a_rank_that_answers_with_a_failure_ends_the_round_early_and_is_asked_again_soon() {
        let id = OperationId(uuid::Uuid::from_u128(1));
        let deadline = Duration::from_secs(60);
        let (mut v, _) = Verification::start(id, r(&[0, 1, 2]), deadline, Duration::ZERO);
        let not_ready = ReplyBody::Failed(crate::protocol::RankError::worker(
            "the rank's HAL is not set up yet",
        ));
        let at = Duration::from_millis(5);
        // Rank 1 cannot report; ranks 0 and 2 have not answered yet: the round waits.
        assert_eq!(v.on_replies(answers(id, vec![(1, not_ready)]), at), None);
        let ok = || ReplyBody::Verified(report(vec![view("dp_0", 3, &[])]));
        assert_eq!(v.on_replies(answers(id, vec![(0, ok())]), at), None);
        // The last one that can answers: the round ends now, not at its deadline.
        let Some(VerifyStep::Done(rep)) = v.on_replies(answers(id, vec![(2, ok())]), at) else {
            panic!("the round should end once only the refusing rank is left");
        };
        assert_eq!(
            (rep.missing.clone(), rep.refused.clone()),
            (r(&[1]), r(&[1]))
        );
        assert_eq!(rep.job_state(), None);
        assert_eq!(rep.ask_again_after(deadline), Some(REFUSED_ASK_AGAIN));
        assert!(rep.to_string().contains("answered with a failure"), "{rep}");
    }

    #[test]
    fn a_rank_that_does_not_answer_is_asked_again_after_the_deadline() {
        let id = OperationId(uuid::Uuid::from_u128(2));
        let deadline = Duration::from_secs(60);
        let (mut v, _) = Verification::start(id, r(&[0, 1]), deadline, Duration::ZERO);
        let not_ready = ReplyBody::Failed(crate::protocol::RankError::worker("not set up"));
        assert_eq!(
            v.on_replies(answers(id, vec![(1, not_ready)]), Duration::ZERO),
            None
        );
        let Some(VerifyStep::Done(rep)) = v.on_deadline(v.token, deadline) else {
            panic!("the deadline ends the round");
        };
        assert_eq!(
            (rep.missing.clone(), rep.refused.clone()),
            (r(&[0, 1]), r(&[1]))
        );
        assert_eq!(
            rep.ask_again_after(deadline),
            Some(deadline),
            "rank 0 never answered"
        );
    }

    #[test]
    fn a_missing_member_is_a_disagreement() {
        let mut m = BTreeMap::new();
        m.insert(GlobalRank(0), report(vec![view("dp_0", 2, &[])]));
        let a = assess(&m);
        assert!(!a.consistent());
        assert!(a.disagreements[0].detail.contains("only 1 of 2"));
        assert_eq!(a.job_state(), JobState::NeedsRecovery);
    }
}
