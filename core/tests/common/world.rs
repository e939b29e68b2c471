//! A job driven by ClusterD, without a runtime: a verified [`JobLedger`], the [`Sequencer`] in
//! front of it, and a world of ranks that answers every broadcast and keeps each rank's own
//! view of which ranks are on their backup NIC (what HCCL would hold per rank). It checks, as
//! it goes, the two rules a driven switch must keep: the gates open only onto views that
//! agree, and a switch result reports what the ranks really hold.

use super::*;
use taskd_core::clusterd::{Origin, Outgoing, Report, Sequencer, Signal, SignalInput, Step};
use taskd_core::ledger::{StopBy, SubmitError};
use taskd_core::protocol::{GateReport, WorkerHello};
use taskd_core::{JobLedger, JobState, SwitchCapabilities};

/// How one rank answers one directive.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Does what it is told and says so.
    Correct,
    /// Changes nothing and says it failed.
    Failed,
    /// Changes nothing and says nothing.
    Silent,
    /// Does what it is told and says nothing (its reply is lost).
    DoneSilently,
}

/// The job, the driver's side of the manager and the ranks.
pub(crate) struct World {
    pub layout: Layout,
    pub ledger: JobLedger,
    pub seq: Sequencer,
    pub now: Duration,
    /// Each rank's view: the ranks it has set to their backup NIC.
    pub views: BTreeMap<GlobalRank, BTreeSet<GlobalRank>>,
    /// The directive in flight, not answered yet.
    pub pending: Option<Directive>,
    /// Every directive broadcast, in order.
    pub sent: Vec<Directive>,
    /// The deadline armed last.
    pub deadline: Option<u64>,
    /// Every report sent to ClusterD, in order.
    pub reports: Vec<Report>,
    /// Every report with its address, in order.
    pub sent_to: Vec<Outgoing>,
    /// Where ClusterD's next signal comes from (session 1, this job, at first).
    pub from: Origin,
    next_id: u128,
}

impl World {
    /// A job of `layout`, every worker registered and verified (every rank on primary);
    /// holds wait `hold`.
    pub(crate) fn new(layout: Layout, hold: Duration) -> World {
        let mut ledger = JobLedger::new(job(), layout.table.clone(), DEADLINES);
        for r in layout.ranks() {
            let hello = WorkerHello {
                job: job(),
                node: layout.node_of(r),
                rank: r,
                capabilities: SwitchCapabilities::ALL,
                instance: taskd_core::Instance::UNKNOWN,
                generation: 0,
            };
            ledger.register(hello).expect("a valid registration");
        }
        let id = op_id(0xfeed);
        let actions = ledger.start_verification(id, secs(0));
        assert!(!broadcasts(&actions).is_empty());
        let none = BTreeSet::new();
        let mut done = Vec::new();
        for nr in layout.verified(id, |r| layout.report(r, &none, GateReport::default())) {
            done = ledger.handle(Event::Replies(nr), secs(0));
        }
        assert!(
            matches!(done.last(), Some(Action::Verified(v)) if v.job_state() == Some(JobState::Running))
        );
        let views = layout
            .ranks()
            .into_iter()
            .map(|r| (r, none.clone()))
            .collect();
        World {
            layout,
            ledger,
            seq: Sequencer::new(hold),
            now: secs(1),
            views,
            pending: None,
            sent: Vec::new(),
            deadline: None,
            reports: Vec::new(),
            sent_to: Vec::new(),
            from: Origin::new(1, job().0),
            next_id: 1,
        }
    }

    fn fresh(&mut self) -> OperationId {
        self.next_id += 1;
        op_id(self.next_id)
    }

    /// ClusterD sends a `ProcessManageSignal`; returns the reports it led to.
    pub(crate) fn signal(&mut self, s: Signal) -> Vec<Report> {
        self.signal_admitting(s, Ok(()))
    }

    /// ClusterD sends a `ProcessManageSignal` while the manager's own verdict on starting an
    /// operation is `admit` (its journal); returns the reports it led to.
    pub(crate) fn signal_admitting(
        &mut self,
        s: Signal,
        admit: Result<(), SubmitError>,
    ) -> Vec<Report> {
        self.now += millis(1);
        let fresh = self.fresh();
        let step = self.seq.on_signal(SignalInput {
            signal: s,
            from: self.from.clone(),
            ledger: &mut self.ledger,
            fresh,
            now: self.now,
            admit,
        });
        self.take(step)
    }

    /// The client's session `session` ended (its signal stream closed); returns the reports.
    pub(crate) fn session_end(&mut self, session: u64) -> Vec<Report> {
        self.now += millis(1);
        let step = self.seq.on_session_end(session, &mut self.ledger, self.now);
        self.take(step)
    }

    /// ClusterD sends a `SwitchRankList`; returns the reports it led to.
    pub(crate) fn switch(&mut self, ranks: &[String], ops: &[bool]) -> Vec<Report> {
        self.now += millis(1);
        let from = self.from.clone();
        let step = self
            .seq
            .on_switch(ranks, ops, &from, &mut self.ledger, self.now);
        self.take(step)
    }

    /// The ranks answer the directive in flight as `how` says; returns the reports.
    pub(crate) fn answer(
        &mut self,
        mut how: impl FnMut(Phase, GlobalRank) -> Reply,
    ) -> Vec<Report> {
        let Some(d) = self.pending.take() else {
            return Vec::new();
        };
        self.now += millis(1);
        let phase = d.phase();
        let mut by_node: BTreeMap<NodeName, Vec<RankReply>> = BTreeMap::new();
        for r in self.layout.ranks() {
            let reply = how(phase, r);
            let applied = matches!(reply, Reply::Correct | Reply::DoneSilently);
            if applied {
                self.apply(r, &d.kind);
            }
            let body = match reply {
                Reply::Silent | Reply::DoneSilently => continue,
                Reply::Failed => ReplyBody::Failed(hal_failure("world", HcclCode::Network)),
                Reply::Correct => self.correct(r, &d.kind),
            };
            by_node
                .entry(self.layout.node_of(r))
                .or_default()
                .push(rank_reply(d.op, r.0, phase, body));
        }
        let mut out = Vec::new();
        for (node, replies) in by_node {
            let nr = NodeReply {
                node,
                op: d.op,
                phase,
                replies,
                health: Vec::new(),
            };
            let actions = self.ledger.handle(Event::Replies(nr), self.now);
            out.extend(self.run(actions));
        }
        out
    }

    /// Every rank answers correctly until nothing is in flight; returns the reports.
    pub(crate) fn settle(&mut self) -> Vec<Report> {
        let mut out = Vec::new();
        while self.pending.is_some() {
            out.extend(self.answer(|_, _| Reply::Correct));
        }
        out
    }

    /// The deadline armed last fires; returns the reports.
    pub(crate) fn fire(&mut self) -> Vec<Report> {
        let Some(token) = self.deadline else {
            return Vec::new();
        };
        self.now += secs(3600);
        let actions = self.ledger.handle(Event::Deadline { token }, self.now);
        self.run(actions)
    }

    /// Carries out actions the test got from the ledger itself; returns the reports.
    pub(crate) fn run_actions(&mut self, actions: Vec<Action>) -> Vec<Report> {
        self.run(actions)
    }

    fn take(&mut self, step: Step) -> Vec<Report> {
        let mut out: Vec<Report> = step.reports.iter().map(|o| o.report.clone()).collect();
        self.reports.extend(out.iter().cloned());
        self.sent_to.extend(step.reports);
        out.extend(self.run(step.actions));
        // As the manager does: ClusterD's stop of training, once the actions are carried out.
        if let Some(reason) = step.stop_training {
            let id = self.fresh();
            let actions = self
                .ledger
                .stop_training(id, StopBy::Clusterd, reason, self.now)
                .expect("the sequencer asks for a stop only when the ledger takes one");
            out.extend(self.run(actions));
        }
        out
    }

    /// Carries out the ledger's actions and hands them to the sequencer; returns the reports.
    fn run(&mut self, actions: Vec<Action>) -> Vec<Report> {
        if actions.is_empty() {
            return Vec::new();
        }
        for a in &actions {
            match a {
                Action::Broadcast(d) => {
                    if d.kind == DirectiveKind::Resume {
                        self.assert_views_agree("the gates open");
                    }
                    self.sent.push(d.clone());
                    self.pending = Some(d.clone());
                }
                Action::ArmDeadline { token, .. } => self.deadline = Some(*token),
                Action::Held(at) => {
                    self.pending = None;
                    self.assert_views_agree(&format!("the operation holds at {at:?}"));
                }
                Action::Finish(_) => self.pending = None,
                Action::Verified(_) => {}
            }
        }
        let fresh = self.fresh();
        let step = self
            .seq
            .on_actions(&actions, &mut self.ledger, fresh, self.now);
        self.take(step)
    }

    fn apply(&mut self, r: GlobalRank, kind: &DirectiveKind) {
        let (targets, restate) = match kind {
            DirectiveKind::Switch { targets, .. } => (targets, &[][..]),
            DirectiveKind::Rollback {
                targets, restate, ..
            } => (targets, &restate[..]),
            _ => return,
        };
        let view = self.views.get_mut(&r).expect("a rank of the job");
        for (t, side) in targets.iter().chain(restate) {
            if *side == NicSide::Backup {
                view.insert(*t);
            } else {
                view.remove(t);
            }
        }
    }

    fn correct(&self, r: GlobalRank, kind: &DirectiveKind) -> ReplyBody {
        match kind {
            DirectiveKind::Sample { .. } => ReplyBody::Sampled {
                in_step: 10,
                in_flight: true,
            },
            DirectiveKind::PauseAt { step } => ReplyBody::Paused { step: *step },
            DirectiveKind::Switch { targets, .. } => ReplyBody::Applied {
                calls: self.layout.calls(r, targets),
            },
            DirectiveKind::Rollback {
                targets, restate, ..
            } => ReplyBody::Applied {
                calls: self.layout.rollback_calls(r, targets, restate),
            },
            DirectiveKind::Resume => ReplyBody::Resumed { stalled: secs(1) },
            DirectiveKind::Verify => panic!("a driven operation never verifies"),
            DirectiveKind::StopTraining { .. } => ReplyBody::Stopped { at_step: None },
            DirectiveKind::AbortInFlight { .. } => ReplyBody::Aborted {
                in_step: 10,
                collectives: Vec::new(),
            },
            DirectiveKind::SwitchInFlight { targets, .. } => ReplyBody::Applied {
                calls: self.layout.calls(r, targets),
            },
        }
    }

    /// Whether every rank holds the same view.
    pub(crate) fn views_agree(&self) -> bool {
        let mut it = self.views.values();
        let first = it.next();
        it.all(|v| Some(v) == first)
    }

    fn assert_views_agree(&self, when: &str) {
        assert!(
            self.views_agree(),
            "{when} while the ranks disagree: {:?}",
            self.views
        );
    }

    /// The view every rank holds (they agree).
    pub(crate) fn view(&self) -> Vec<u32> {
        self.assert_views_agree("reading the view");
        self.views
            .values()
            .next()
            .map(|v| v.iter().map(|r| r.0).collect())
            .unwrap_or_default()
    }

    /// The manager's NIC table.
    pub(crate) fn table(&self) -> Vec<u32> {
        self.ledger.ranks_on_backup().map(|r| r.0).collect()
    }
}

/// `"0"`, `"8"`, ...: rank ids as ClusterD sends them.
pub(crate) fn ids(v: &[u32]) -> Vec<String> {
    v.iter().map(u32::to_string).collect()
}
