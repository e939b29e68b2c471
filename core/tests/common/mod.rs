//! Shared helpers for the integration tests of the operation machine and the ledger: a
//! realistic job layout (world + tp + dp groups), the replies a real worker would send, and a
//! harness that drives one [`Operation`] and logs every action it takes.

#![allow(dead_code)]

pub(crate) mod world;

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::time::Duration;
use taskd_core::command::Target;
use taskd_core::operation::PhaseDurations;
use taskd_core::protocol::{
    AppliedCall, Directive, DirectiveKind, GateReport, GroupView, NodeReply, Phase, RankError,
    RankReply, ReplyBody, WorkerReport,
};
use taskd_core::{
    plan_calls, Action, DeviceId, Event, GlobalRank, GroupInfo, HalError, HcclCode, JobId, NicSide,
    NodeName, Operation, OperationId, OperationReport, PhaseDeadlines, RankTable, SwitchCommand,
    SwitchPlan,
};

pub(crate) fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

pub(crate) fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

pub(crate) fn op_id(n: u128) -> OperationId {
    OperationId(uuid::Uuid::from_u128(n))
}

pub(crate) fn job() -> JobId {
    JobId("job-a".into())
}

/// Deadlines that differ per phase, so a test can tell which one was armed.
pub(crate) const DEADLINES: PhaseDeadlines = PhaseDeadlines {
    pause: Duration::from_secs(30),
    switch: Duration::from_secs(20),
    rollback: Duration::from_secs(25),
    resume: Duration::from_secs(10),
};

/// `nodes x per_node` ranks, `rank = node * per_node + device`, with the groups of a
/// tensor-parallel-inside-a-node, data-parallel-across-nodes job:
/// `world` (every rank), `tp_{node}` (the ranks of one node), `dp_{device}` (the ranks with one
/// device index on every node).
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    pub(crate) nodes: u32,
    pub(crate) per_node: u32,
    pub(crate) table: RankTable,
}

impl Layout {
    pub(crate) fn new(nodes: u32, per_node: u32) -> Self {
        Layout {
            nodes,
            per_node,
            table: RankTable::uniform(nodes, per_node),
        }
    }

    pub(crate) fn world(&self) -> u32 {
        self.nodes * self.per_node
    }

    pub(crate) fn ranks(&self) -> Vec<GlobalRank> {
        (0..self.world()).map(GlobalRank).collect()
    }

    pub(crate) fn node_of(&self, r: GlobalRank) -> NodeName {
        self.table.slot(r).expect("rank in the table").node.clone()
    }

    pub(crate) fn device_of(&self, r: GlobalRank) -> DeviceId {
        self.table.slot(r).expect("rank in the table").device
    }

    /// The rank of the other die of `r`'s NPU, when the job has it.
    pub(crate) fn rank_of_partner(&self, r: GlobalRank) -> Option<GlobalRank> {
        self.table
            .rank_of(&self.node_of(r), self.device_of(r).partner())
    }

    pub(crate) fn node_name(&self, n: u32) -> NodeName {
        NodeName::uniform(n)
    }

    /// Every group of the job.
    pub(crate) fn all_groups(&self) -> Vec<GroupInfo> {
        let g = |name: String, members: Vec<u32>| GroupInfo {
            name,
            members: members.into_iter().map(GlobalRank).collect(),
        };
        let mut v = vec![g("world".into(), (0..self.world()).collect())];
        for n in 0..self.nodes {
            v.push(g(
                format!("tp_{n}"),
                (n * self.per_node..(n + 1) * self.per_node).collect(),
            ));
        }
        for d in 0..self.per_node {
            v.push(g(
                format!("dp_{d}"),
                (0..self.nodes).map(|n| n * self.per_node + d).collect(),
            ));
        }
        v
    }

    /// The groups one process belongs to, in the (unsorted) order its framework lists them.
    pub(crate) fn groups_of(&self, r: GlobalRank) -> Vec<GroupInfo> {
        self.all_groups()
            .into_iter()
            .filter(|g| g.members.contains(&r))
            .collect()
    }

    pub(crate) fn group_size(&self, name: &str) -> usize {
        self.all_groups()
            .into_iter()
            .find(|g| g.name == name)
            .map(|g| g.members.len())
            .expect("known group")
    }

    /// What a correct worker of rank `r` reports to a verification when `backup` are the
    /// ranks on their backup NIC (every group agreeing) and its gate is as `gate` says.
    pub(crate) fn report(
        &self,
        r: GlobalRank,
        backup: &BTreeSet<GlobalRank>,
        gate: GateReport,
    ) -> WorkerReport {
        let mut groups: Vec<GroupView> = self
            .groups_of(r)
            .into_iter()
            .map(|g| GroupView {
                unsettled: Vec::new(),
                size: g.members.len() as u32,
                on_backup: g
                    .members
                    .iter()
                    .filter(|m| backup.contains(m))
                    .copied()
                    .collect(),
                group: g.name,
            })
            .collect();
        groups.sort_by(|a, b| a.group.cmp(&b.group));
        WorkerReport { groups, gate }
    }

    /// The node replies of every rank to verification `op`, each reporting `report(rank)`.
    pub(crate) fn verified(
        &self,
        op: OperationId,
        report: impl Fn(GlobalRank) -> WorkerReport,
    ) -> Vec<NodeReply> {
        let mut by_node: BTreeMap<NodeName, Vec<RankReply>> = BTreeMap::new();
        for r in self.ranks() {
            by_node.entry(self.node_of(r)).or_default().push(rank_reply(
                op,
                r.0,
                Phase::Verify,
                ReplyBody::Verified(report(r)),
            ));
        }
        by_node
            .into_iter()
            .map(|(node, replies)| NodeReply {
                node,
                op,
                phase: Phase::Verify,
                replies,
                health: vec![],
            })
            .collect()
    }

    /// What a correct worker of rank `r` reports after applying `targets`.
    pub(crate) fn calls(
        &self,
        r: GlobalRank,
        targets: &[(GlobalRank, NicSide)],
    ) -> Vec<AppliedCall> {
        let groups = self.groups_of(r);
        plan_calls(&groups, targets)
            .into_iter()
            .map(|c| AppliedCall {
                group_size: groups
                    .iter()
                    .find(|g| g.name == c.group)
                    .map(|g| g.members.len() as u32)
                    .expect("planned group is one of the rank's"),
                digest: c.digest(),
                group: c.group,
            })
            .collect()
    }

    /// The calls of a rollback on `r`: `targets`, then `restate` in a second round.
    pub(crate) fn rollback_calls(
        &self,
        r: GlobalRank,
        targets: &[(GlobalRank, NicSide)],
        restate: &[(GlobalRank, NicSide)],
    ) -> Vec<AppliedCall> {
        let mut calls = self.calls(r, targets);
        for c in self.calls(r, restate) {
            AppliedCall::record(&mut calls, c);
        }
        calls
    }

    /// The operator's command for `(rank, use_backup)` pairs, in that order. The two dies of one NPU are never told opposite sides (the
    /// validation refuses that): a later partner follows the first one's flag. A die whose
    /// partner is not in the job (an odd die count) never goes to backup (refused too).
    pub(crate) fn command(&self, targets: &[(u32, bool)]) -> SwitchCommand {
        let mut seen: std::collections::BTreeMap<(NodeName, u32), bool> = Default::default();
        let targets = targets
            .iter()
            .map(|(r, b)| {
                let node = self.node_of(GlobalRank(*r));
                let device = self.device_of(GlobalRank(*r));
                let partnered = self.table.rank_of(&node, device.partner()).is_some();
                let b = &(*b && partnered);
                let use_backup = *seen.get(&(node.clone(), device.partner().0)).unwrap_or(b);
                seen.entry((node.clone(), device.0)).or_insert(use_backup);
                Target {
                    node,
                    device,
                    use_backup,
                }
            })
            .collect();
        SwitchCommand {
            job: job(),
            id: None,
            targets,
        }
    }

    pub(crate) fn plan(&self, targets: &[(u32, bool)]) -> SwitchPlan {
        self.command(targets)
            .resolve(&self.table)
            .expect("valid targets")
    }
}

/// `(rank, use_backup)` pairs as the `(rank, side)` pairs of directives.
pub(crate) fn flags(v: &[(u32, bool)]) -> Vec<(GlobalRank, NicSide)> {
    v.iter()
        .map(|(r, b)| (GlobalRank(*r), NicSide::from_use_backup(*b)))
        .collect()
}

pub(crate) fn ranks(v: &[u32]) -> Vec<GlobalRank> {
    v.iter().copied().map(GlobalRank).collect()
}

pub(crate) fn hal_failure(group: &str, code: HcclCode) -> RankError {
    RankError {
        group: Some(group.to_owned()),
        hal: Some(HalError::new(
            "HcclCommWorkingDevNicSet",
            code,
            format!("set working nic on {group}"),
        )),
        message: format!("HcclCommWorkingDevNicSet on {group} failed"),
    }
}

pub(crate) fn rank_reply(op: OperationId, rank: u32, phase: Phase, body: ReplyBody) -> RankReply {
    RankReply {
        rank: GlobalRank(rank),
        op,
        phase,
        body,
    }
}

pub(crate) fn broadcasts(actions: &[Action]) -> Vec<&Directive> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Broadcast(d) => Some(d),
            _ => None,
        })
        .collect()
}

pub(crate) fn broadcast_phases(actions: &[Action]) -> Vec<Phase> {
    broadcasts(actions).into_iter().map(|d| d.phase()).collect()
}

pub(crate) fn finishes(actions: &[Action]) -> Vec<&OperationReport> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Finish(r) => Some(&**r),
            _ => None,
        })
        .collect()
}

/// `[Broadcast(kind), ArmDeadline(token, phase, at)]`: what entering a phase looks like.
pub(crate) fn entered(
    op: OperationId,
    kind: DirectiveKind,
    token: u64,
    at: Duration,
) -> Vec<Action> {
    let d = Directive { op, kind };
    let phase = d.phase();
    vec![
        Action::Broadcast(d),
        Action::ArmDeadline { token, phase, at },
    ]
}

pub(crate) fn durations(
    pause: Option<u64>,
    switch: Option<u64>,
    rollback: Option<u64>,
    resume: Option<u64>,
    total: u64,
) -> PhaseDurations {
    PhaseDurations {
        pause: pause.map(secs),
        switch: switch.map(secs),
        rollback: rollback.map(secs),
        resume: resume.map(secs),
        total: secs(total),
    }
}

/// One [`Operation`] under test, with every action it produced so far.
pub(crate) struct Harness {
    pub(crate) layout: Layout,
    pub(crate) id: OperationId,
    pub(crate) op: Operation,
    pub(crate) plan: SwitchPlan,
    pub(crate) targets: Vec<(GlobalRank, NicSide)>,
    pub(crate) previous: Vec<(GlobalRank, NicSide)>,
    pub(crate) log: Vec<Action>,
}

impl Harness {
    /// Starts an operation over every rank of `layout`; returns the start actions too.
    pub(crate) fn start(
        layout: Layout,
        targets: &[(u32, bool)],
        previous: &[(u32, bool)],
        now: Duration,
    ) -> (Harness, Vec<Action>) {
        let plan = layout.plan(targets);
        let id = op_id(0xA11CE);
        let (op, actions) = Operation::start(
            id,
            plan.clone(),
            flags(previous),
            layout.ranks(),
            DEADLINES,
            now,
        );
        let h = Harness {
            targets: plan.rank_sides(),
            previous: flags(previous),
            layout,
            id,
            op,
            plan,
            log: actions.clone(),
        };
        (h, actions)
    }

    pub(crate) fn send(&mut self, ev: Event, now: Duration) -> Vec<Action> {
        let actions = self.op.handle(ev, now);
        self.log.extend(actions.iter().cloned());
        actions
    }

    pub(crate) fn node_reply(
        &self,
        node: NodeName,
        phase: Phase,
        replies: Vec<RankReply>,
    ) -> NodeReply {
        NodeReply {
            node,
            op: self.id,
            phase,
            replies,
            health: Vec::new(),
        }
    }

    /// One rank's reply, alone in its node's message.
    pub(crate) fn one(
        &mut self,
        now: Duration,
        rank: u32,
        phase: Phase,
        body: ReplyBody,
    ) -> Vec<Action> {
        let nr = self.node_reply(
            self.layout.node_of(GlobalRank(rank)),
            phase,
            vec![rank_reply(self.id, rank, phase, body)],
        );
        self.send(Event::Replies(nr), now)
    }

    /// Replies of `ranks`, one message per node (nodes in name order); all actions, in order.
    pub(crate) fn each(
        &mut self,
        now: Duration,
        phase: Phase,
        ranks: &[u32],
        body: impl Fn(GlobalRank) -> ReplyBody,
    ) -> Vec<Action> {
        let mut by_node: BTreeMap<NodeName, Vec<RankReply>> = BTreeMap::new();
        for r in ranks {
            let g = GlobalRank(*r);
            by_node
                .entry(self.layout.node_of(g))
                .or_default()
                .push(rank_reply(self.id, *r, phase, body(g)));
        }
        let mut out = Vec::new();
        for (node, replies) in by_node {
            let nr = self.node_reply(node, phase, replies);
            out.extend(self.send(Event::Replies(nr), now));
        }
        out
    }

    pub(crate) fn all_ranks(&self) -> Vec<u32> {
        (0..self.layout.world()).collect()
    }

    pub(crate) fn all_but(&self, skip: &[u32]) -> Vec<u32> {
        self.all_ranks()
            .into_iter()
            .filter(|r| !skip.contains(r))
            .collect()
    }

    pub(crate) fn sampled(
        &mut self,
        now: Duration,
        ranks: &[u32],
        step: impl Fn(u32) -> u64,
    ) -> Vec<Action> {
        self.each(now, Phase::Sample, ranks, |r| ReplyBody::Sampled {
            in_step: step(r.0),
            in_flight: false,
        })
    }

    pub(crate) fn paused(&mut self, now: Duration, ranks: &[u32], step: u64) -> Vec<Action> {
        self.each(now, Phase::Pause, ranks, |_| ReplyBody::Paused { step })
    }

    /// Correct `Applied` replies for the switch (to the targets) or rollback (to `previous`).
    pub(crate) fn applied(&mut self, now: Duration, phase: Phase, ranks: &[u32]) -> Vec<Action> {
        let flags = self.flags_for(phase);
        let layout = self.layout.clone();
        self.each(now, phase, ranks, |r| ReplyBody::Applied {
            calls: layout.calls(r, &flags),
        })
    }

    pub(crate) fn resumed(&mut self, now: Duration, ranks: &[u32]) -> Vec<Action> {
        self.each(now, Phase::Resume, ranks, |r| ReplyBody::Resumed {
            stalled: millis(100 * u64::from(r.0)),
        })
    }

    pub(crate) fn flags_for(&self, phase: Phase) -> Vec<(GlobalRank, NicSide)> {
        match phase {
            Phase::Switch => self.targets.clone(),
            Phase::Rollback => self.previous.clone(),
            p => panic!("no NIC flags in the {p} phase"),
        }
    }

    pub(crate) fn calls(&self, rank: u32, phase: Phase) -> Vec<AppliedCall> {
        self.layout.calls(GlobalRank(rank), &self.flags_for(phase))
    }

    /// The token of the deadline armed last.
    pub(crate) fn token(&self) -> u64 {
        self.log
            .iter()
            .rev()
            .find_map(|a| match a {
                Action::ArmDeadline { token, .. } => Some(*token),
                _ => None,
            })
            .expect("a deadline was armed")
    }

    /// Fires the deadline armed last.
    pub(crate) fn fire(&mut self, now: Duration) -> Vec<Action> {
        let token = self.token();
        self.send(Event::Deadline { token }, now)
    }

    pub(crate) fn lose(&mut self, now: Duration, rank: u32) -> Vec<Action> {
        self.send(
            Event::WorkerLost {
                rank: GlobalRank(rank),
                reason: format!("connection of rank {rank} closed"),
            },
            now,
        )
    }

    pub(crate) fn phases(&self) -> Vec<Phase> {
        broadcast_phases(&self.log)
    }

    pub(crate) fn pending(&self) -> Vec<u32> {
        self.op.pending().iter().map(|r| r.0).collect()
    }

    /// The one final report; asserts it is the last action of the log and the only one.
    pub(crate) fn report(&self) -> OperationReport {
        let f = finishes(&self.log);
        assert_eq!(f.len(), 1, "exactly one Finish in {:#?}", self.log);
        assert!(
            matches!(self.log.last(), Some(Action::Finish(_))),
            "Finish is the last action"
        );
        assert!(self.op.is_finished());
        f[0].clone()
    }

    /// Drives a clean run through Sample (all at `step`) and Pause; returns at the switch.
    pub(crate) fn run_to_switch(&mut self, start: u64, step: u64) {
        let all = self.all_ranks();
        self.sampled(secs(start + 1), &all, |_| step);
        self.paused(secs(start + 2), &all, step);
        assert_eq!(self.op.phase(), Phase::Switch);
    }
}
