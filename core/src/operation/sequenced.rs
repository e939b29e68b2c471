//! A [`OperationKind::Sequenced`] operation: the stages of a switch, each started by an outside
//! driver (ClusterD, through `core/src/external.rs`).
//!
//! ```text
//!  Sample ─▶ Pause ─▶ HOLD (Action::Held(Paused)) ──command_switch──▶ Switch ─▶ HOLD (Held(Switched))
//!                       │                                               │ fails ─▶ Rollback ─┘
//!                       │ command_resume / deadline / lost / abort      │ rollback fails: done, job paused
//!                       ▼                                               ▼
//!                     Resume ─▶ done                                  command_resume ─▶ Resume ─▶ done
//!  command_stop at a hold: done, every rank stays held (job paused, the groups agree)
//! ```
//!
//! The pause, the switch, the digest checks and the rollback are the ones every operation runs;
//! what is added is the hold: between two stages every rank stays held at the same step, and the
//! operation waits for a command, at most [`Commands::hold`] (then it resumes on the NIC state
//! the groups agree on). A command that comes while a stage runs is kept and carried out at the
//! next hold: a resume resumes at once, a stop ends the operation with the gates shut. At most
//! one switch per operation.

use super::*;

/// What a sequenced operation was told and how long it may hold.
#[derive(Clone, Debug)]
pub(super) struct Commands {
    /// The longest a hold waits for the next command.
    hold: Duration,
    /// Resume at the next hold point.
    resume: bool,
    /// End at the next hold point without resuming, and why.
    stop: Option<String>,
    /// The switch was commanded (at most once).
    switched: bool,
}

impl Commands {
    /// Resume at the next hold point instead of waiting there (the manager is stopping).
    pub(super) fn resume_at_hold(&mut self) {
        self.resume = true;
    }
}

/// What a holding sequenced operation waits for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Awaiting {
    /// Its targets (or a resume: a pause with no switch).
    Targets,
    /// Its resume (the switch is over).
    Resume,
}

impl Awaiting {
    /// For messages: "its targets", "its resume".
    pub fn as_str(self) -> &'static str {
        match self {
            Awaiting::Targets => "its targets",
            Awaiting::Resume => "its resume",
        }
    }
}

/// Why a command to a sequenced operation cannot be carried out. Nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// The operation is an operator's switch or a recovery: it sequences itself.
    #[error("operation {0} runs by itself; only a sequenced operation takes commands")]
    NotSequenced(OperationId),
    /// The final report is out.
    #[error("operation {0} is over")]
    Finished(OperationId),
    /// A sequenced operation switches once.
    #[error("operation {0} already switched; a sequenced operation switches at most once")]
    AlreadySwitched(OperationId),
    /// The switch needs every rank held, waiting for its targets.
    #[error("operation {id} is in {phase}, not holding for its targets")]
    NotHolding {
        /// The operation.
        id: OperationId,
        /// Where it is.
        phase: Phase,
    },
    /// The stop came while the gates were opening: training runs on.
    #[error("operation {0} is already resuming; training was not stopped")]
    Resuming(OperationId),
}

impl Operation {
    /// Starts a [`OperationKind::Sequenced`] operation over `ranks`: the pause, then a hold of
    /// at most `hold` for the next command. With `stop`, it ends at the first hold point, every
    /// rank held (a driver's "stop training").
    pub fn start_sequenced(
        id: OperationId,
        ranks: impl IntoIterator<Item = GlobalRank>,
        deadlines: PhaseDeadlines,
        hold: Duration,
        stop: Option<String>,
        now: Duration,
    ) -> (Operation, Vec<Action>) {
        let ranks = ranks.into_iter().collect();
        let plan = SwitchPlan {
            targets: Vec::new(),
        };
        let kind = OperationKind::Sequenced;
        let (mut op, actions) = Operation::begin(
            (kind, Trigger::Operator),
            id,
            plan,
            Vec::new(),
            ranks,
            deadlines,
            now,
        );
        op.seq = Some(Commands {
            hold,
            resume: false,
            stop,
            switched: false,
        });
        (op, actions)
    }

    /// Whether every rank holds and the operation waits for a command.
    pub fn is_holding(&self) -> bool {
        matches!(self.stage, Stage::Holding { .. })
    }

    /// What a holding operation waits for (`None` when it does not hold).
    pub fn awaiting(&self) -> Option<Awaiting> {
        match (&self.stage, &self.seq) {
            (Stage::Holding { nic }, Some(seq))
                if *nic == NicChange::Unchanged && !seq.switched =>
            {
                Some(Awaiting::Targets)
            }
            (Stage::Holding { .. }, _) => Some(Awaiting::Resume),
            _ => None,
        }
    }

    /// Switches to `plan` (`previous`: the targets' current side, for the rollback). Only while
    /// holding for the targets, once.
    pub fn command_switch(
        &mut self,
        plan: SwitchPlan,
        previous: Vec<(GlobalRank, NicSide)>,
        now: Duration,
    ) -> Result<Vec<Action>, CommandError> {
        let id = self.id;
        let awaiting = self.awaiting();
        let phase = self.phase();
        let seq = self.commands()?;
        if seq.switched {
            return Err(CommandError::AlreadySwitched(id));
        }
        if awaiting != Some(Awaiting::Targets) {
            return Err(CommandError::NotHolding { id, phase });
        }
        seq.switched = true;
        self.previous = RollbackTargets::new(&plan, previous);
        self.plan = plan;
        let targets = self.plan.rank_sides();
        let applying = Stage::Applying(Tally::default());
        let call_timeout = self.deadlines.call_timeout(Phase::Switch);
        let switch = DirectiveKind::Switch {
            targets,
            call_timeout,
        };
        Ok(self.enter(applying, switch, now))
    }

    /// Resumes: at once while holding, else at the next hold point.
    pub fn command_resume(&mut self, now: Duration) -> Result<Vec<Action>, CommandError> {
        self.commands()?;
        match self.stage {
            Stage::Holding { .. } => Ok(self.leave_hold(now)),
            Stage::Resuming(_) => Ok(Vec::new()),
            _ => {
                self.commands()?.resume = true;
                Ok(Vec::new())
            }
        }
    }

    /// Ends the operation at a hold point without resuming: at once while holding, else at the
    /// next one (a switch in flight finishes or rolls back first). Too late once resuming.
    pub fn command_stop(
        &mut self,
        reason: String,
        now: Duration,
    ) -> Result<Vec<Action>, CommandError> {
        let id = self.id;
        self.commands()?;
        match self.stage {
            Stage::Holding { .. } => {
                let phase = self.phase();
                self.fail(OperationError::Stopped { phase, reason });
                Ok(self.finish(now))
            }
            Stage::Resuming(_) => Err(CommandError::Resuming(id)),
            _ => {
                self.commands()?.stop = Some(reason);
                Ok(Vec::new())
            }
        }
    }

    /// The commands of a sequenced operation that is not over.
    fn commands(&mut self) -> Result<&mut Commands, CommandError> {
        let id = self.id;
        if self.is_finished() {
            return Err(CommandError::Finished(id));
        }
        self.seq.as_mut().ok_or(CommandError::NotSequenced(id))
    }

    /// Every rank holds at `at` with `nic` done: tell the driver, then carry out a command that
    /// came meanwhile, or wait for one until the hold deadline.
    pub(super) fn hold(&mut self, nic: NicChange, at: HoldPoint, now: Duration) -> Vec<Action> {
        self.stage = Stage::Holding { nic };
        self.round = Round {
            token: self.round.token + 1,
            started: now,
            pending: BTreeSet::new(),
        };
        let mut actions = vec![Action::Held(at)];
        let Some(seq) = self.seq.clone() else {
            return actions;
        };
        if let Some(reason) = seq.stop {
            let phase = self.phase();
            self.fail(OperationError::Stopped { phase, reason });
            actions.extend(self.finish(now));
        } else if seq.resume {
            actions.extend(self.resume(nic, now));
        } else {
            actions.push(Action::ArmDeadline {
                token: self.round.token,
                phase: Phase::Pause,
                at: now + seq.hold,
            });
        }
        actions
    }

    /// The switch (or its rollback) is over with `nic`: a sequenced operation holds, any other
    /// resumes.
    pub(super) fn resume_or_hold(&mut self, nic: NicChange, now: Duration) -> Vec<Action> {
        if self.kind == OperationKind::Sequenced {
            let applied = nic == NicChange::Applied;
            self.hold(nic, HoldPoint::Switched { applied }, now)
        } else {
            self.resume(nic, now)
        }
    }

    /// Leaves a hold by resuming on the NIC state the groups agree on.
    pub(super) fn leave_hold(&mut self, now: Duration) -> Vec<Action> {
        match self.stage {
            Stage::Holding { nic } => self.resume(nic, now),
            _ => Vec::new(),
        }
    }

    /// The hold deadline passed without a command.
    pub(super) fn hold_expired(&mut self, now: Duration) -> Vec<Action> {
        let awaiting = self.awaiting().map_or("a command", Awaiting::as_str);
        let held = self.seq.as_ref().map(|s| s.hold).unwrap_or_default();
        self.fail(OperationError::HoldExpired {
            held,
            awaiting: awaiting.to_owned(),
        });
        self.leave_hold(now)
    }
}
