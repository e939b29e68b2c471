//! The simulator's per-step timeline: when every rank completed each training step, and which
//! operation phase was running meanwhile, so step time can be plotted around each operation
//! (`taskd sim --timeline FILE.csv`).
//!
//! A step's time is when its *last* rank completed it (a job's step is as slow as its slowest
//! rank). Phase times are when the progress events reached the simulator, on the same clock:
//! microseconds after the manager published them.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use taskd_actors::progress::{ProgressEvent, ProgressKind};
use taskd_core::protocol::Phase;
use taskd_core::OperationId;
use taskd_hal_mock::{Hold, StepHook};

/// How many of the latest steps a [`StepClock`] keeps: the live simulator (`--serve`) trains
/// for as long as it runs, and its memory must stay flat (1 MiB of steps at most).
pub const STEPS_KEPT: usize = 1 << 16;

/// When every rank completed each of the latest [`STEPS_KEPT`] steps, since the clock started,
/// and when ranks were held at their step boundary.
pub struct StepClock {
    start: Instant,
    world: u32,
    steps: Mutex<Steps>,
    holds: Mutex<Option<Holds>>,
}

/// The holds at the step boundary that ended since [`StepClock::take_holds`] was last called:
/// when the first began and the last ended (the stall of an operation, from the first rank
/// held to the last one training again), on the clock of the [`StepClock`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holds {
    /// When the first rank was held.
    pub first_held: Duration,
    /// When the last held rank trained again.
    pub last_released: Duration,
    /// How many ranks were held.
    pub ranks: u64,
}

impl Holds {
    /// From the first rank held to the last one released.
    pub fn stall(&self) -> Duration {
        self.last_released.saturating_sub(self.first_held)
    }
}

/// Per step from `first` on: ranks that completed it, and when the last one did.
struct Steps {
    first: u64,
    v: VecDeque<(u32, Duration)>,
}

impl StepClock {
    /// A clock for a job of `world` ranks, started now: a step counts as completed when all
    /// `world` ranks have reported it.
    pub fn new(world: u32) -> Arc<StepClock> {
        Arc::new(StepClock {
            start: Instant::now(),
            world,
            steps: Mutex::new(Steps {
                first: 1,
                v: VecDeque::new(),
            }),
            holds: Mutex::new(None),
        })
    }

    /// A rank was held from `from` to `to` (on this clock).
    fn held(&self, from: Duration, to: Duration) {
        let mut h = self.holds.lock().unwrap_or_else(|e| e.into_inner());
        let h = h.get_or_insert(Holds {
            first_held: from,
            last_released: to,
            ranks: 0,
        });
        h.first_held = h.first_held.min(from);
        h.last_released = h.last_released.max(to);
        h.ranks += 1;
    }

    /// The holds that ended since the last call (`None`: none did), forgotten here.
    pub fn take_holds(&self) -> Option<Holds> {
        self.holds.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Time since the clock started.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    fn record(&self, step: u64) {
        let now = self.elapsed();
        let mut steps = self.lock();
        // Steps older than the window (or 0) are not kept.
        let Some(i) = step.checked_sub(steps.first) else {
            return;
        };
        let i = i as usize;
        if i >= STEPS_KEPT {
            // Slide the window so that `step` is its newest entry.
            let drop = (i + 1 - STEPS_KEPT).min(steps.v.len());
            steps.v.drain(..drop);
            steps.first = step + 1 - STEPS_KEPT as u64;
        }
        let i = (step - steps.first) as usize;
        if steps.v.len() <= i {
            steps.v.resize(i + 1, (0, Duration::ZERO));
        }
        let e = &mut steps.v[i];
        e.0 += 1;
        e.1 = e.1.max(now);
    }

    fn lock(&self) -> MutexGuard<'_, Steps> {
        self.steps.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `(step, when its last rank completed it)` for every kept step all ranks completed.
    pub fn completed_steps(&self) -> Vec<(u64, Duration)> {
        let steps = self.lock();
        steps
            .v
            .iter()
            .enumerate()
            .filter(|(_, (n, _))| *n >= self.world)
            .map(|(i, (_, at))| (steps.first + i as u64, *at))
            .collect()
    }

    /// `hook`, timed by this clock.
    pub fn wrap(self: &Arc<Self>, hook: Arc<dyn StepHook>) -> Arc<dyn StepHook> {
        Arc::new(TimedHook {
            inner: hook,
            clock: self.clone(),
        })
    }
}

/// A rank's step hook that notes the time before handing the boundary on (to the step gate,
/// which may hold the rank there).
struct TimedHook {
    inner: Arc<dyn StepHook>,
    clock: Arc<StepClock>,
}

impl StepHook for TimedHook {
    fn step_completed(&self, step: u64) -> Option<Hold<'_>> {
        self.clock.record(step);
        let hold = self.inner.step_completed(step)?;
        let from = self.clock.elapsed();
        Some(Box::pin(async move {
            let outcome = hold.await;
            self.clock.held(from, self.clock.elapsed());
            outcome
        }))
    }
}

/// One phase of one operation, on the clock of a [`StepClock`].
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseSpan {
    /// The operation.
    pub op: OperationId,
    /// Which of its phases.
    pub phase: Phase,
    /// When its `PhaseStarted` event arrived.
    pub start: Duration,
    /// `None` while it runs.
    pub end: Option<Duration>,
}

/// The phases of the operations seen, from their progress events.
#[derive(Clone, Debug, Default)]
pub struct PhaseLog {
    /// In the order they started.
    pub phases: Vec<PhaseSpan>,
}

impl PhaseLog {
    /// Notes `ev`, received at `now`.
    pub fn observe(&mut self, ev: &ProgressEvent, now: Duration) {
        match &ev.kind {
            ProgressKind::PhaseStarted { phase, .. } => self.phases.push(PhaseSpan {
                op: ev.op,
                phase: *phase,
                start: now,
                end: None,
            }),
            ProgressKind::PhaseFinished { phase, .. } => {
                if let Some(p) = self
                    .phases
                    .iter_mut()
                    .rev()
                    .find(|p| p.op == ev.op && p.phase == *phase && p.end.is_none())
                {
                    p.end = Some(now);
                }
            }
            ProgressKind::Finished(_) => {
                for p in self.phases.iter_mut().filter(|p| p.op == ev.op) {
                    p.end.get_or_insert(now);
                }
            }
            ProgressKind::Started { .. }
            | ProgressKind::Waiting { .. }
            | ProgressKind::Links { .. }
            | ProgressKind::Decision(_) => {}
        }
    }
}

/// One row of the timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRow {
    /// The training step (1 for the first).
    pub step: u64,
    /// When its last rank completed it.
    pub at: Duration,
    /// Since the previous step (since the clock started for the first).
    pub took: Duration,
    /// The operation one of whose phases overlapped the step, if any.
    pub op: Option<OperationId>,
    /// Those phases, in order.
    pub phases: Vec<Phase>,
}

/// Step times and the operation phases around them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    /// One per step, ascending.
    pub rows: Vec<StepRow>,
}

impl Timeline {
    /// The CSV's first line; the column names are part of `--timeline`'s documented format.
    pub const CSV_HEADER: &'static str = "step,time_ms,step_ms,operation,phase";

    /// Lines `steps` (from [`StepClock::completed_steps`]) up with `phases`. A phase belongs to
    /// a step when they overlap: it started before the step ended and ended after the
    /// previous step did.
    pub fn build(steps: &[(u64, Duration)], phases: &PhaseLog) -> Timeline {
        let mut rows = Vec::with_capacity(steps.len());
        let mut prev = Duration::ZERO;
        for &(step, at) in steps {
            let overlapping: Vec<&PhaseSpan> = phases
                .phases
                .iter()
                .filter(|p| p.start < at && p.end.map_or(true, |end| end > prev))
                .collect();
            rows.push(StepRow {
                step,
                at,
                took: at.saturating_sub(prev),
                op: overlapping.first().map(|p| p.op),
                phases: overlapping.iter().map(|p| p.phase).collect(),
            });
            prev = at;
        }
        Timeline { rows }
    }

    /// `step,time_ms,step_ms,operation,phase`: one row per step; `phase` joins the phases
    /// that overlapped the step with `+`, empty when none did.
    pub fn write_csv(&self, w: &mut impl Write) -> io::Result<()> {
        writeln!(w, "{}", Self::CSV_HEADER)?;
        for r in &self.rows {
            let phases: Vec<&str> = r.phases.iter().map(|p| p.as_str()).collect();
            writeln!(
                w,
                "{},{:.3},{:.3},{},{}",
                r.step,
                r.at.as_secs_f64() * 1e3,
                r.took.as_secs_f64() * 1e3,
                r.op.map(|o| o.to_string()).unwrap_or_default(),
                phases.join("+"),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_keeps_a_window_of_the_latest_steps() {
        let clock = StepClock::new(2);
        let total = STEPS_KEPT as u64 + 1000;
        for step in 1..=total {
            clock.record(step);
            clock.record(step);
        }
        // A straggler's report of a step that left the window is ignored.
        clock.record(3);
        let done = clock.completed_steps();
        assert_eq!(done.len(), STEPS_KEPT);
        assert_eq!(done.first().unwrap().0, 1001);
        assert_eq!(done.last().unwrap().0, total);
        assert!(done.windows(2).all(|w| w[0].0 + 1 == w[1].0));
        // A step far ahead slides the window past everything kept.
        clock.record(total + 3 * STEPS_KEPT as u64);
        clock.record(total + 3 * STEPS_KEPT as u64);
        assert_eq!(clock.completed_steps().len(), 1);
    }

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn a_step_is_done_when_its_last_rank_is() {
        let clock = StepClock::new(2);
        let hooks: Vec<_> = (0..2)
            .map(|_| clock.wrap(Arc::new(taskd_hal_mock::NoPause)))
            .collect();
        hooks[0].step_completed(1);
        assert_eq!(clock.completed_steps(), []);
        hooks[1].step_completed(1);
        hooks[1].step_completed(2);
        let done = clock.completed_steps();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].0, 1);
    }

    #[test]
    fn phases_are_matched_to_the_steps_they_overlap() {
        let op = OperationId(uuid::Uuid::from_u128(7));
        let ev = |kind| ProgressEvent {
            op,
            at: Duration::ZERO,
            kind,
        };
        let mut log = PhaseLog::default();
        let started = |phase| {
            ev(ProgressKind::PhaseStarted {
                phase,
                waiting: 2,
                pause_step: None,
            })
        };
        let finished = |phase| {
            ev(ProgressKind::PhaseFinished {
                phase,
                took: Duration::ZERO,
            })
        };
        log.observe(&started(Phase::Sample), ms(25));
        log.observe(&finished(Phase::Sample), ms(31));
        log.observe(&started(Phase::Pause), ms(31));
        log.observe(&finished(Phase::Pause), ms(40));
        log.observe(&started(Phase::Switch), ms(40));
        log.observe(&finished(Phase::Switch), ms(45));
        log.observe(&started(Phase::Resume), ms(45));
        log.observe(&finished(Phase::Resume), ms(46));
        let steps = [
            (1, ms(10)),
            (2, ms(20)),
            (3, ms(30)),
            (4, ms(40)),
            (5, ms(56)),
            (6, ms(66)),
        ];
        let t = Timeline::build(&steps, &log);
        let phases: Vec<Vec<Phase>> = t.rows.iter().map(|r| r.phases.clone()).collect();
        assert_eq!(
            phases,
            [
                vec![],
                vec![],
                vec![Phase::Sample],
                vec![Phase::Sample, Phase::Pause],
                vec![Phase::Switch, Phase::Resume],
                vec![],
            ]
        );
        assert_eq!(t.rows[4].took, ms(16));
        assert_eq!(t.rows[4].op, Some(op));
        assert_eq!(t.rows[0].op, None);

        let mut csv = Vec::new();
        t.write_csv(&mut csv).unwrap();
        let csv = String::from_utf8(csv).unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], Timeline::CSV_HEADER);
        assert_eq!(lines[1], "1,10.000,10.000,,");
        assert_eq!(lines[5], format!("5,56.000,16.000,{op},switch+resume"));
    }
}
