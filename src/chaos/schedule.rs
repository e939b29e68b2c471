//! What one chaos schedule does, as plain data: a list of [`Step`]s drawn from the seed by
//! [`Schedule::generate`] and nothing else, so a seed always gives the same schedule. The
//! driver (`super::driver`) carries the steps out on a simulated job.
//!
//! A schedule is a few rounds. A round arms some faults (NIC-set calls that fail, hang or are
//! slow on random ranks; a link going down), submits an operator's switch (a new one, or the
//! way back of an earlier one), optionally disrupts it when a chosen phase starts (the manager
//! is killed or stopped, a worker's connection or a node's proxy is lost, a second command
//! arrives, a link goes down) and follows up (training, a repeated or reused uuid, a lost
//! worker coming back, an idle manager restart, a recovery). The last step may kill a rank's
//! process for good.
//!
//! One seed in [`RECOVERY_PERCENT`] (drawn from a generator of its own, so every other seed's
//! schedule is what it always was) is a *recovery schedule* instead ([`Schedule::recovery`]):
//! its job runs with process recovery (a budget of 1 to 3 restarts) and a launcher on every
//! node that follows the manager's orders. Its rounds keep to faults that no process outlives
//! unnoticed (NIC-set faults, links, a second command; no manager or worker connection lost),
//! and add the cases of process recovery: a rank's process killed during or between
//! operations ([`Step::KillRank`], [`Disruption::KillRank`]), a stop of training while a
//! node's proxy is cut off ([`Step::StopWhileCut`]), and a proxy lost with nothing in flight
//! ([`Step::ProxyAway`], back later or at the end: [`Step::ProxyBack`]).

use super::rng::SplitMix64;
use std::fmt;
use std::time::Duration;
use taskd_core::ledger::{ProcessRecovery, RecoverTo};
use taskd_core::protocol::Phase;
use taskd_core::HcclCode;

/// Nodes of every schedule's job.
pub const NODES: u32 = 2;
/// Devices (ranks) per node of every schedule's job.
pub const DEVICES: u32 = 4;
/// Ranks of every schedule's job.
pub const RANKS: u32 = NODES * DEVICES;
/// The share of seeds, in percent, whose schedule is a recovery schedule.
pub const RECOVERY_PERCENT: u64 = 20;
/// What a seed is mixed with to draw whether its schedule is a recovery schedule.
const RECOVERY_SALT: u64 = 0x7265_636f_7665_7279;

/// One device told to use its backup NIC (`backup`) or its primary.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Index of the node (`node-{node}`).
    pub node: u32,
    /// Device on the node; may be out of range, to be refused.
    pub device: u32,
    /// The side asked for.
    pub backup: bool,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = if self.backup { "backup" } else { "primary" };
        write!(f, "node-{}:{}->{side}", self.node, self.device)
    }
}

/// A fault for one rank's next `HcclCommWorkingDevNicSet` call.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum NicFault {
    /// The call fails with this code (its peers apply).
    Fail(HcclCode),
    /// The call hangs this long, then fails with `HCCL_E_TIMEOUT`.
    Hang(Duration),
    /// The call takes this much longer, then succeeds.
    Slow(Duration),
}

/// What happens to a switch once it reaches a phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Disruption {
    /// The manager dies (`kill -9`); a new one takes over.
    KillManager,
    /// The manager is stopped (SIGTERM: it ends the operation safely) and a new one starts.
    Drain,
    /// The connection of this rank's worker closes; the process lives on.
    Disconnect {
        /// Global rank.
        rank: u32,
    },
    /// This node's proxy dies; it is started again once the operation ended.
    KillProxy {
        /// Node index.
        node: u32,
    },
    /// A second command arrives while the first runs (with the first one's uuid, or its own).
    Concurrent {
        /// Its targets.
        targets: Vec<Target>,
        /// Whether it carries the running operation's uuid.
        same_id: bool,
    },
    /// A worker whose connection closed earlier in the operation connects again.
    Reconnect {
        /// Global rank.
        rank: u32,
    },
    /// The proxy killed earlier in the operation starts again.
    RestartProxy {
        /// Node index.
        node: u32,
    },
    /// A physical port goes down (it comes back after the operation).
    LinkDown {
        /// Node index.
        node: u32,
        /// Device whose port it is.
        device: u32,
    },
    /// This rank's process dies, in a job with process recovery: the whole job restarts.
    KillRank {
        /// Global rank.
        rank: u32,
    },
}

/// Who stops training while a node's proxy is cut off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CutStop {
    /// An operator, with nothing in flight (the job `degraded`).
    Operator,
    /// The hold policy, after this switch lost the node when `phase` started (the job held).
    Policy {
        /// The switch's uuid.
        id: u128,
        /// Its targets.
        targets: Vec<Target>,
        /// The phase at which the node's proxy dies.
        phase: Phase,
    },
}

/// What happens while a manager verifies a returning worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Interrupt {
    /// The manager dies; a new one takes over.
    RestartManager,
    /// The manager is stopped (SIGTERM); a new one starts.
    StopManager,
    /// Another worker's connection closes.
    Disconnect {
        /// Global rank.
        rank: u32,
    },
    /// An operator submits a switch (refused while the round runs, or admitted after it).
    Switch {
        /// Its uuid.
        id: u128,
        /// Its targets.
        targets: Vec<Target>,
    },
}

/// An operator's switch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Switch {
    /// Its uuid (as `u128`).
    pub id: u128,
    /// Its targets.
    pub targets: Vec<Target>,
    /// What disrupts it, each when its phase starts (in order; at most two).
    pub during: Vec<(Phase, Disruption)>,
}

/// One step of a schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Train this many steps (when the job runs).
    Train(u64),
    /// Queue a fault for a rank's next NIC-set call.
    Fault {
        /// Global rank.
        rank: u32,
        /// The fault.
        fault: NicFault,
    },
    /// Bring a physical port down or up.
    Link {
        /// Node index.
        node: u32,
        /// Device whose port it is.
        device: u32,
        /// Up or down.
        up: bool,
    },
    /// Submit a switch and see it through.
    Switch(Switch),
    /// Submit the `of`-th switch of the schedule again: same uuid, same request.
    Repeat {
        /// Index among the schedule's switches.
        of: usize,
    },
    /// Submit the uuid of the `of`-th switch with another request.
    Reuse {
        /// Index among the schedule's switches.
        of: usize,
        /// The other request.
        targets: Vec<Target>,
    },
    /// A worker whose connection closed connects again.
    Reconnect {
        /// Global rank.
        rank: u32,
        /// What happens right after, before the manager verified the returning rank.
        then: Option<Interrupt>,
    },
    /// The manager dies while nothing runs; a new one takes over.
    RestartManager,
    /// The operator recovers the job (refused when it runs).
    Recover(RecoverTo),
    /// The process of a rank dies for good (the last step: nothing trains afterwards).
    KillProcess {
        /// Global rank.
        rank: u32,
    },
    /// The process of a rank dies in a job with process recovery: the whole job restarts (or
    /// ends, its budget spent).
    KillRank {
        /// Global rank.
        rank: u32,
    },
    /// Training is stopped while this node's proxy is cut off; the proxy comes back after.
    StopWhileCut {
        /// Node index.
        node: u32,
        /// Who stops.
        by: CutStop,
    },
    /// This node's proxy dies with nothing in flight: the job is `degraded`, training goes on.
    ProxyAway {
        /// Node index.
        node: u32,
    },
    /// The proxy [`Step::ProxyAway`] lost starts again.
    ProxyBack {
        /// Node index.
        node: u32,
    },
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Train(n) => write!(f, "train {n} steps"),
            Step::Fault { rank, fault } => write!(f, "rank {rank}'s next NIC set: {fault:?}"),
            Step::Link { node, device, up } => {
                let state = if *up { "up" } else { "down" };
                write!(f, "link node-{node}:{device} {state}")
            }
            Step::Switch(s) => {
                write!(f, "switch {:08x} [{}]", s.id >> 96, list(&s.targets))?;
                for (phase, d) in &s.during {
                    write!(f, ", {d:?} at {phase}")?;
                }
                Ok(())
            }
            Step::Repeat { of } => write!(f, "repeat switch #{of}"),
            Step::Reuse { of, targets } => {
                write!(f, "reuse the uuid of switch #{of} for [{}]", list(targets))
            }
            Step::Reconnect { rank, then } => {
                write!(f, "worker {rank} reconnects")?;
                if let Some(then) = then {
                    write!(f, ", then at once {then:?}")?;
                }
                Ok(())
            }
            Step::RestartManager => f.write_str("manager killed while idle, restarted"),
            Step::Recover(to) => write!(f, "recover --to {}", to.as_str()),
            Step::KillProcess { rank } => write!(f, "process of rank {rank} killed"),
            Step::KillRank { rank } => {
                write!(f, "process of rank {rank} killed (process recovery)")
            }
            Step::StopWhileCut { node, by } => match by {
                CutStop::Operator => write!(
                    f,
                    "proxy of node-{node} killed, then an operator stops training"
                ),
                CutStop::Policy { id, targets, phase } => write!(
                    f,
                    "switch {:08x} [{}], proxy of node-{node} killed at {phase}, then the hold \
                     policy stops training",
                    id >> 96,
                    list(targets)
                ),
            },
            Step::ProxyAway { node } => {
                write!(f, "proxy of node-{node} killed with nothing in flight")
            }
            Step::ProxyBack { node } => write!(f, "proxy of node-{node} back"),
        }
    }
}

fn list(targets: &[Target]) -> String {
    targets
        .iter()
        .map(Target::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// One seed's schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// The seed it was drawn from.
    pub seed: u64,
    /// What happens, in order.
    pub steps: Vec<Step>,
    /// The side `recover` re-states at the end, if the job needs it.
    pub recover_to: RecoverTo,
    /// A switch that must succeed once the job runs again at the end.
    pub final_switch: Vec<Target>,
    /// A recovery schedule's process recovery (see the module); `None` for every other one.
    pub recovery: Option<ProcessRecovery>,
}

/// The phases a disruption may wait for.
const PHASES: [Phase; 5] = [
    Phase::Sample,
    Phase::Pause,
    Phase::Switch,
    Phase::Rollback,
    Phase::Resume,
];

/// The codes an injected NIC-set failure returns.
const FAIL_CODES: [HcclCode; 4] = [
    HcclCode::Network,
    HcclCode::Internal,
    HcclCode::Timeout,
    HcclCode::RoceConnect,
];

/// Draws schedules: the generator and what earlier steps of the schedule did.
struct Draw {
    rng: SplitMix64,
    steps: Vec<Step>,
    /// Target lists of the switches so far, by index.
    switches: Vec<Vec<Target>>,
    /// Workers whose connection is closed.
    disconnected: Vec<u32>,
    /// A recovery schedule: only the faults it keeps to (see the module).
    recovery: bool,
    /// The node whose proxy is away with nothing in flight (a recovery schedule's).
    away: Option<u32>,
}

impl Schedule {
    /// The schedule of `seed`: a pure function of it.
    pub fn generate(seed: u64) -> Schedule {
        if SplitMix64::new(seed ^ RECOVERY_SALT).chance(RECOVERY_PERCENT) {
            return Schedule::generate_recovery(seed);
        }
        let mut d = Draw::new(seed, false);
        let first = d.rng.range(1, 3);
        d.steps.push(Step::Train(first));
        for _ in 0..d.rng.range(2, 4) {
            d.round();
        }
        if d.rng.chance(3) {
            let rank = d.rank();
            d.steps.push(Step::KillProcess { rank });
        }
        let recover_to = *d
            .rng
            .pick(&[RecoverTo::Primary, RecoverTo::Backup, RecoverTo::AsIs]);
        let final_switch = d.valid_targets();
        Schedule {
            seed,
            steps: d.steps,
            recover_to,
            final_switch,
            recovery: None,
        }
    }

    /// A recovery schedule (see the module): a few rounds, each followed most of the time by
    /// one of the cases of process recovery.
    fn generate_recovery(seed: u64) -> Schedule {
        let mut d = Draw::new(seed, true);
        let max_restarts = d.rng.range(1, 3) as u32;
        let first = d.rng.range(1, 3);
        d.steps.push(Step::Train(first));
        for _ in 0..d.rng.range(2, 4) {
            d.round();
            if d.rng.chance(75) {
                d.recovery_case();
            }
        }
        let recover_to = *d
            .rng
            .pick(&[RecoverTo::Primary, RecoverTo::Backup, RecoverTo::AsIs]);
        let final_switch = d.valid_targets();
        Schedule {
            seed,
            steps: d.steps,
            recover_to,
            final_switch,
            recovery: Some(ProcessRecovery { max_restarts }),
        }
    }

    /// How many switches the schedule submits (not counting repeats).
    pub fn switches(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, Step::Switch(_)))
            .count()
    }
}

impl Draw {
    fn new(seed: u64, recovery: bool) -> Draw {
        Draw {
            rng: SplitMix64::new(seed),
            steps: Vec::new(),
            switches: Vec::new(),
            disconnected: Vec::new(),
            recovery,
            away: None,
        }
    }

    /// One case of process recovery; while a proxy is away, mostly its return.
    fn recovery_case(&mut self) {
        let node = self.rng.below(u64::from(NODES)) as u32;
        if let Some(away) = self.away {
            if self.rng.chance(60) {
                self.away = None;
                self.steps.push(Step::ProxyBack { node: away });
            }
            return;
        }
        match self.rng.below(100) {
            0..=39 => {
                let rank = self.rank();
                self.steps.push(Step::KillRank { rank });
            }
            40..=69 => {
                let by = if self.rng.chance(50) {
                    CutStop::Operator
                } else {
                    CutStop::Policy {
                        id: self.rng.next_u128(),
                        targets: self.valid_targets(),
                        phase: *self.rng.pick(&[Phase::Sample, Phase::Pause, Phase::Switch]),
                    }
                };
                self.steps.push(Step::StopWhileCut { node, by });
            }
            _ => {
                self.steps.push(Step::ProxyAway { node });
                let n = self.rng.range(2, 5);
                self.steps.push(Step::Train(n));
                // Back soon, in a later round, or only at the end.
                if self.rng.chance(50) {
                    self.steps.push(Step::ProxyBack { node });
                } else {
                    self.away = Some(node);
                }
            }
        }
    }

    fn rank(&mut self) -> u32 {
        self.rng.below(u64::from(RANKS)) as u32
    }

    /// Faults before, the switch, and what follows.
    fn round(&mut self) {
        if self.rng.chance(55) {
            for _ in 0..self.rng.range(1, 2) {
                let rank = self.rank();
                let fault = self.nic_fault();
                self.steps.push(Step::Fault { rank, fault });
            }
        }
        let flap = self.rng.chance(12).then(|| {
            let (node, device) = (self.rng.below(2) as u32, self.rng.below(4) as u32);
            self.steps.push(Step::Link {
                node,
                device,
                up: false,
            });
            (node, device)
        });
        let switch = self.switch();
        let link_down: Vec<(u32, u32)> = switch
            .during
            .iter()
            .filter_map(|(_, d)| match d {
                Disruption::LinkDown { node, device } => Some((*node, *device)),
                _ => None,
            })
            .collect();
        self.switches.push(switch.targets.clone());
        self.steps.push(Step::Switch(switch));
        for (node, device) in flap.into_iter().chain(link_down) {
            if self.rng.chance(85) {
                self.steps.push(Step::Link {
                    node,
                    device,
                    up: true,
                });
            }
        }
        self.follow_up();
    }

    fn nic_fault(&mut self) -> NicFault {
        let ms = |d: &mut Draw, lo, hi| Duration::from_millis(d.rng.range(lo, hi));
        match self.rng.below(100) {
            0..=44 => NicFault::Fail(*self.rng.pick(&FAIL_CODES)),
            // Mostly inside the switch deadline; one in five past it.
            45..=69 if self.rng.chance(80) => NicFault::Hang(ms(self, 5, 200)),
            // Rarely past the peers' HCCL timeout: they give up on the call.
            45..=69 if self.rng.chance(10) => NicFault::Hang(ms(self, 1_100, 1_300)),
            45..=69 => NicFault::Hang(ms(self, 320, 600)),
            _ if self.rng.chance(80) => NicFault::Slow(ms(self, 1, 100)),
            _ => NicFault::Slow(ms(self, 320, 450)),
        }
    }

    /// New targets: one to three distinct devices, mostly to backup; rarely a device the
    /// job does not have.
    fn new_targets(&mut self) -> Vec<Target> {
        let mut out: Vec<Target> = Vec::new();
        for _ in 0..self.rng.range(1, 3) {
            let node = self.rng.below(u64::from(NODES)) as u32;
            let device = if self.rng.chance(3) {
                DEVICES + self.rng.below(4) as u32
            } else {
                self.rng.below(u64::from(DEVICES)) as u32
            };
            if out.iter().any(|t| t.node == node && t.device == device) {
                continue;
            }
            let backup = self.rng.chance(75);
            out.push(Target {
                node,
                device,
                backup,
            });
        }
        out
    }

    /// One or two devices of different NPUs (so never the two dies of one NPU told opposite
    /// sides), each to a random side: a command the job must run.
    fn valid_targets(&mut self) -> Vec<Target> {
        let first = self.rng.below(u64::from(RANKS)) as u32;
        let mut ranks = vec![first];
        if self.rng.chance(50) {
            let other = self.rng.below(u64::from(RANKS)) as u32;
            if other / 2 != first / 2 {
                ranks.push(other);
            }
        }
        ranks
            .into_iter()
            .map(|r| Target {
                node: r / DEVICES,
                device: r % DEVICES,
                backup: self.rng.chance(50),
            })
            .collect()
    }

    fn switch(&mut self) -> Switch {
        let targets = if !self.switches.is_empty() && self.rng.chance(45) {
            // The way back of an earlier switch.
            let i = self.rng.below(self.switches.len() as u64) as usize;
            self.switches[i]
                .iter()
                .map(|t| Target {
                    backup: !t.backup,
                    ..*t
                })
                .collect()
        } else {
            self.new_targets()
        };
        let mut during = Vec::new();
        if self.rng.chance(50) {
            let phase = *self.rng.pick(&PHASES);
            let first = self.disruption();
            let second = self.rng.chance(35).then(|| self.cascade(&first)).flatten();
            during.push((phase, first));
            if let Some(second) = second {
                let later: Vec<Phase> = PHASES.iter().copied().filter(|p| *p >= phase).collect();
                during.push((*self.rng.pick(&later), second));
            }
        }
        Switch {
            id: self.rng.next_u128(),
            targets,
            during,
        }
    }

    /// What may follow `first` later in the same operation: the lost worker or proxy comes
    /// back, or the manager goes too, or another worker, or a link. A dead proxy is never
    /// followed by a manager restart (a new manager would reach the dead proxy).
    fn cascade(&mut self, first: &Disruption) -> Option<Disruption> {
        if self.recovery {
            return None;
        }
        let link = |d: &mut Draw| Disruption::LinkDown {
            node: d.rng.below(u64::from(NODES)) as u32,
            device: d.rng.below(u64::from(DEVICES)) as u32,
        };
        Some(match (first, self.rng.below(5)) {
            (Disruption::KillManager | Disruption::Drain, _) => return None,
            (Disruption::Disconnect { rank }, 0 | 1) => {
                let rank = *rank;
                self.disconnected.retain(|r| *r != rank);
                Disruption::Reconnect { rank }
            }
            (Disruption::KillProxy { node }, 0 | 1) => Disruption::RestartProxy { node: *node },
            (Disruption::KillProxy { .. }, 2) => Disruption::Drain,
            (Disruption::KillProxy { .. }, 3) => self.disconnect(),
            (Disruption::KillProxy { .. }, _) => link(self),
            (_, 0 | 1) => Disruption::KillManager,
            (_, 2) => Disruption::Drain,
            (_, 3) => self.disconnect(),
            _ => link(self),
        })
    }

    fn disruption(&mut self) -> Disruption {
        if self.recovery {
            return match self.rng.below(100) {
                0..=39 => Disruption::KillRank { rank: self.rank() },
                40..=79 => Disruption::Concurrent {
                    targets: self.new_targets(),
                    same_id: self.rng.chance(30),
                },
                _ => Disruption::LinkDown {
                    node: self.rng.below(u64::from(NODES)) as u32,
                    device: self.rng.below(u64::from(DEVICES)) as u32,
                },
            };
        }
        match self.rng.below(100) {
            0..=21 => Disruption::KillManager,
            22..=35 => Disruption::Drain,
            36..=55 => self.disconnect(),
            56..=70 => Disruption::KillProxy {
                node: self.rng.below(u64::from(NODES)) as u32,
            },
            71..=92 => Disruption::Concurrent {
                targets: self.new_targets(),
                same_id: self.rng.chance(30),
            },
            _ => Disruption::LinkDown {
                node: self.rng.below(u64::from(NODES)) as u32,
                device: self.rng.below(u64::from(DEVICES)) as u32,
            },
        }
    }

    fn disconnect(&mut self) -> Disruption {
        let rank = self.rank();
        if !self.disconnected.contains(&rank) {
            self.disconnected.push(rank);
        }
        Disruption::Disconnect { rank }
    }

    fn follow_up(&mut self) {
        if self.rng.chance(70) {
            let n = self.rng.range(1, 3);
            self.steps.push(Step::Train(n));
        }
        if self.rng.chance(15) {
            let of = self.rng.below(self.switches.len() as u64) as usize;
            self.steps.push(Step::Repeat { of });
        }
        if self.rng.chance(7) {
            let of = self.rng.below(self.switches.len() as u64) as usize;
            let targets = self.new_targets();
            self.steps.push(Step::Reuse { of, targets });
        }
        if self.recovery {
            if self.rng.chance(25) {
                let to = *self
                    .rng
                    .pick(&[RecoverTo::Primary, RecoverTo::Backup, RecoverTo::AsIs]);
                self.steps.push(Step::Recover(to));
            }
            return;
        }
        // A lost worker mostly comes back soon; otherwise at the end.
        let back: Vec<u32> = self
            .disconnected
            .iter()
            .copied()
            .filter(|_| self.rng.chance(70))
            .collect();
        for rank in back {
            self.disconnected.retain(|r| *r != rank);
            let then = match self.rng.below(100) {
                0..=9 => Some(Interrupt::RestartManager),
                10..=14 => Some(Interrupt::StopManager),
                15..=22 => match self.disconnect() {
                    Disruption::Disconnect { rank } => Some(Interrupt::Disconnect { rank }),
                    _ => None,
                },
                23..=32 => Some(Interrupt::Switch {
                    id: self.rng.next_u128(),
                    targets: self.valid_targets(),
                }),
                _ => None,
            };
            self.steps.push(Step::Reconnect { rank, then });
        }
        if self.rng.chance(8) {
            self.steps.push(Step::RestartManager);
        }
        if self.rng.chance(25) {
            let to = *self
                .rng
                .pick(&[RecoverTo::Primary, RecoverTo::Backup, RecoverTo::AsIs]);
            self.steps.push(Step::Recover(to));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn a_seed_always_gives_the_same_schedule() {
        for seed in [0, 1, 42, u64::MAX] {
            assert_eq!(Schedule::generate(seed), Schedule::generate(seed));
        }
        // And different seeds explore different schedules.
        let distinct: std::collections::BTreeSet<String> = (0..50)
            .map(|s| format!("{:?}", Schedule::generate(s).steps))
            .collect();
        assert_eq!(distinct.len(), 50);
    }

    #[test]
    fn schedules_stay_small_and_well_formed() {
        for seed in 0..500 {
            let s = Schedule::generate(seed);
            assert!(matches!(s.steps[0], Step::Train(1..=3)), "{seed}");
            assert!((2..=4).contains(&s.switches()), "{seed}: {}", s.switches());
            assert!(s.steps.len() <= 40, "{seed}: {} steps", s.steps.len());
            let f = &s.final_switch;
            assert!(!f.is_empty() && f.len() <= 2, "{seed}");
            assert!(
                f.iter().all(|t| t.node < NODES && t.device < DEVICES),
                "{seed}"
            );
            assert!(
                f.len() == 1 || f[0].node != f[1].node || f[0].device / 2 != f[1].device / 2,
                "{seed}"
            );
            for (i, step) in s.steps.iter().enumerate() {
                match step {
                    Step::KillProcess { .. } => {
                        assert!(s.recovery.is_none(), "{seed}");
                        assert_eq!(i, s.steps.len() - 1, "{seed}")
                    }
                    // A proxy comes back only after it went away.
                    Step::ProxyBack { node } => assert!(
                        s.steps[..i].contains(&Step::ProxyAway { node: *node }),
                        "{seed}"
                    ),
                    Step::KillRank { .. } | Step::StopWhileCut { .. } | Step::ProxyAway { .. } => {
                        assert!(s.recovery.is_some(), "{seed}")
                    }
                    // A recovery schedule loses no manager and no worker connection.
                    Step::RestartManager | Step::Reconnect { .. } => {
                        assert!(s.recovery.is_none(), "{seed}")
                    }
                    Step::Fault {
                        fault: NicFault::Hang(d) | NicFault::Slow(d),
                        ..
                    } => assert!(*d <= Duration::from_millis(1_300), "{seed}"),
                    Step::Repeat { of } | Step::Reuse { of, .. } => {
                        assert!(*of < s.switches(), "{seed}")
                    }
                    Step::Switch(sw) => {
                        assert!(!sw.targets.is_empty(), "{seed}");
                        assert!(sw.during.len() <= 2, "{seed}");
                        // A dead proxy comes back before any manager restarts.
                        let kinds: Vec<&Disruption> = sw.during.iter().map(|(_, d)| d).collect();
                        if let [Disruption::KillProxy { .. }, second] = kinds[..] {
                            assert!(
                                !matches!(second, Disruption::KillManager),
                                "{seed}: {second:?}"
                            );
                        }
                        // Disruptions follow the phases.
                        assert!(sw.during.windows(2).all(|w| w[0].0 <= w[1].0), "{seed}");
                        if s.recovery.is_some() {
                            assert!(
                                sw.during.iter().all(|(_, d)| matches!(
                                    d,
                                    Disruption::KillRank { .. }
                                        | Disruption::Concurrent { .. }
                                        | Disruption::LinkDown { .. }
                                )),
                                "{seed}: {:?}",
                                sw.during
                            );
                        } else {
                            assert!(
                                !sw.during
                                    .iter()
                                    .any(|(_, d)| matches!(d, Disruption::KillRank { .. })),
                                "{seed}"
                            );
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn every_kind_of_chaos_is_drawn() {
        let mut kinds = std::collections::BTreeSet::new();
        for seed in 0..300 {
            for step in Schedule::generate(seed).steps {
                let kind = match step {
                    Step::Switch(Switch { during, .. }) if !during.is_empty() => {
                        if during.len() == 2 {
                            kinds.insert("cascade".to_owned());
                        }
                        let d = &during[during.len() - 1].1;
                        format!("{d:?}")
                            .split([' ', '{'])
                            .next()
                            .unwrap()
                            .to_owned()
                    }
                    Step::Reconnect { then: Some(i), .. } => format!("then{i:?}")
                        .split([' ', '{'])
                        .next()
                        .unwrap()
                        .to_owned(),
                    other => format!("{other:?}")
                        .split([' ', '(', '{'])
                        .next()
                        .unwrap()
                        .to_owned(),
                };
                kinds.insert(kind);
            }
        }
        for k in [
            "Train",
            "Fault",
            "Link",
            "Switch",
            "Repeat",
            "Reuse",
            "Reconnect",
            "thenRestartManager",
            "thenStopManager",
            "thenDisconnect",
            "thenSwitch",
            "RestartProxy",
            "cascade",
            "RestartManager",
            "Recover",
            "KillProcess",
            "KillManager",
            "Drain",
            "Disconnect",
            "KillProxy",
            "Concurrent",
            "LinkDown",
            "KillRank",
            "StopWhileCut",
            "ProxyAway",
            "ProxyBack",
        ] {
            assert!(kinds.contains(k), "{k} never drawn: {kinds:?}");
        }
    }

    #[test]
    fn a_fifth_of_the_seeds_are_recovery_schedules_with_every_case() {
        let mut recovery = 0;
        let (mut by_operator, mut by_policy, mut budgets) = (0, 0, BTreeSet::new());
        for seed in 0..1_000 {
            let s = Schedule::generate(seed);
            let Some(r) = s.recovery else { continue };
            recovery += 1;
            budgets.insert(r.max_restarts);
            for step in &s.steps {
                match step {
                    Step::StopWhileCut {
                        by: CutStop::Operator,
                        ..
                    } => by_operator += 1,
                    Step::StopWhileCut {
                        by: CutStop::Policy { .. },
                        ..
                    } => by_policy += 1,
                    _ => {}
                }
            }
        }
        assert!((150..=250).contains(&recovery), "{recovery}");
        assert!(
            by_operator > 20 && by_policy > 20,
            "{by_operator} {by_policy}"
        );
        assert_eq!(budgets, BTreeSet::from([1, 2, 3]));
    }
}
