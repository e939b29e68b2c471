//! A worker's hang watch: whether its training loop stopped finishing steps.
//!
//! Under `TSP:1` HCCL's watchdog is off, so a collective that never completes (a peer that
//! hangs, a link that drops its packets without an error) blocks every member for good and
//! nothing fails. The worker samples its gate's last finished step every
//! [`HangWatch::period`]; a step it had not seen, a hold at the gate or a stop counts as
//! progress. No progress for the timeout is a stall, said once ([`Change::Stalled`]); the
//! next step after it is said too ([`Change::Progressing`]). Sampling keeps the gate's fast
//! path free of clocks: the stall is seen between `timeout` and `timeout + period` after the
//! last progress.
//!
//! The watch starts at the loop's first finished step: before it the process compiles its
//! graph and builds its communicators, which takes as long as it takes.

use std::time::{Duration, Instant};

/// What the gate says now, as the watch reads it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Sample {
    /// The last step the loop finished (`None` before its first).
    pub(crate) last_step: Option<u64>,
    /// Training is held at the gate, or was stopped: not the loop's doing.
    pub(crate) resting: bool,
}

/// A change the worker reports upstream.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// No progress for `stalled_for` (at least the timeout), after `last_step`.
    Stalled {
        last_step: u64,
        stalled_for: Duration,
    },
    /// The loop finished `last_step` after a stall.
    Progressing { last_step: u64 },
}

/// The watch of one worker.
#[derive(Debug)]
pub(crate) struct HangWatch {
    timeout: Duration,
    /// The step seen last, and when progress was last seen.
    seen: Option<u64>,
    progress_at: Instant,
    stalled: bool,
}

impl HangWatch {
    /// A watch with `timeout`, started at `now`.
    pub(crate) fn new(timeout: Duration, now: Instant) -> Self {
        HangWatch {
            timeout,
            seen: None,
            progress_at: now,
            stalled: false,
        }
    }

    /// How often to sample: a quarter of the timeout, between 10 ms and 10 s.
    pub(crate) fn period(&self) -> Duration {
        (self.timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(10))
    }

    /// Takes one sample at `now`: the change to report, if any.
    pub(crate) fn observe(&mut self, s: Sample, now: Instant) -> Option<Change> {
        let stepped = s.last_step.is_some() && s.last_step != self.seen;
        self.seen = s.last_step;
        if stepped || s.resting || s.last_step.is_none() {
            self.progress_at = now;
            let was = std::mem::replace(&mut self.stalled, false);
            return match (was, s.last_step) {
                (true, Some(last_step)) => Some(Change::Progressing { last_step }),
                _ => None,
            };
        }
        let idle = now.saturating_duration_since(self.progress_at);
        if self.stalled || idle < self.timeout {
            return None;
        }
        self.stalled = true;
        Some(Change::Stalled {
            last_step: s.last_step?,
            stalled_for: idle,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(60);

    fn at(t0: Instant, s: u64) -> Instant {
        t0 + Duration::from_secs(s)
    }

    fn stepped(n: u64) -> Sample {
        Sample {
            last_step: Some(n),
            resting: false,
        }
    }

    #[test]
    fn a_loop_that_stops_stepping_is_said_stalled_once_and_progressing_when_it_steps_again() {
        let t0 = Instant::now();
        let mut w = HangWatch::new(T, t0);
        assert_eq!(w.observe(stepped(1), at(t0, 1)), None);
        assert_eq!(w.observe(stepped(1), at(t0, 60)), None, "59 s idle");
        assert_eq!(
            w.observe(stepped(1), at(t0, 61)),
            Some(Change::Stalled {
                last_step: 1,
                stalled_for: T
            })
        );
        assert_eq!(w.observe(stepped(1), at(t0, 200)), None, "said once");
        assert_eq!(
            w.observe(stepped(2), at(t0, 201)),
            Some(Change::Progressing { last_step: 2 })
        );
        assert_eq!(w.observe(stepped(3), at(t0, 202)), None);
    }

    #[test]
    fn neither_the_time_before_the_first_step_nor_a_hold_at_the_gate_counts() {
        let t0 = Instant::now();
        let mut w = HangWatch::new(T, t0);
        let before = Sample {
            last_step: None,
            resting: false,
        };
        assert_eq!(w.observe(before, at(t0, 3600)), None, "an hour compiling");
        assert_eq!(w.observe(stepped(1), at(t0, 3601)), None);
        let held = Sample {
            last_step: Some(1),
            resting: true,
        };
        assert_eq!(w.observe(held, at(t0, 3700)), None, "held for a switch");
        assert_eq!(
            w.observe(stepped(1), at(t0, 3759)),
            None,
            "59 s since the release"
        );
        assert!(matches!(
            w.observe(stepped(1), at(t0, 3761)),
            Some(Change::Stalled { last_step: 1, .. })
        ));
    }

    #[test]
    fn the_sampling_period_is_a_quarter_of_the_timeout_within_bounds() {
        let t0 = Instant::now();
        assert_eq!(
            HangWatch::new(Duration::from_millis(200), t0).period(),
            Duration::from_millis(50)
        );
        assert_eq!(
            HangWatch::new(Duration::from_millis(8), t0).period(),
            Duration::from_millis(10)
        );
        assert_eq!(
            HangWatch::new(Duration::from_secs(1836), t0).period(),
            Duration::from_secs(10)
        );
    }
}
