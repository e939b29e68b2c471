//! The schedules of the process campaign (`taskd chaos --processes`): fewer and coarser than
//! the in-process ones, drawn from the same [`SplitMix64`] so a seed fixes its schedule. A
//! schedule is a few steps: a switch (or switchback) with at most one fault landing when a
//! chosen phase starts, a fault alone, a uuid repeated, an operator's recovery.
//!
//! About one schedule in three ends with a switch that meets a fault of the manager's state
//! directory: its file system filled up, or frozen (as a hung NFS server or a dying disk),
//! landing before the switch is submitted (its admission meets it) or when one of its phases
//! starts. Those are drawn from a stream of their own, so the steps of a seed are the ones
//! it had before disk faults existed.

use super::job::{NODES, PPN};
use crate::chaos::rng::SplitMix64;
use std::fmt;
use taskd_core::protocol::Phase;

/// A fault injected into the job of processes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// kill -9 of the manager; a new one on the same state directory and port.
    KillManager,
    /// kill -9 of node k's proxy; a new one on the same port.
    KillProxy(u32),
    /// kill -9 of rank r's worker; its launcher starts a new incarnation.
    KillWorker(u32),
    /// SIGSTOP of the manager (`None`) or of node k's proxy, SIGCONT `ms` later.
    Freeze {
        /// `None`: the manager.
        proxy: Option<u32>,
        /// How long it stays frozen.
        ms: u64,
    },
    /// Node k's link to the manager cut (connections dropped, new ones refused) for `ms`.
    Cut {
        /// The node.
        node: u32,
        /// How long.
        ms: u64,
    },
    /// Node k's link to the manager blackholed (nothing passes) for `ms`.
    Blackhole {
        /// The node.
        node: u32,
        /// How long.
        ms: u64,
    },
    /// The file system of the manager's state directory full for `ms`.
    FillDisk {
        /// How long.
        ms: u64,
    },
    /// The file system of the manager's state directory frozen (`fsfreeze`) for `ms`.
    FreezeDisk {
        /// How long.
        ms: u64,
    },
}

impl Fault {
    /// Its kind, as the report counts it.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::KillManager => "kill_manager",
            Fault::KillProxy(_) => "kill_proxy",
            Fault::KillWorker(_) => "kill_worker",
            Fault::Freeze { proxy: None, .. } => "freeze_manager",
            Fault::Freeze { .. } => "freeze_proxy",
            Fault::Cut { .. } => "link_cut",
            Fault::Blackhole { .. } => "link_blackhole",
            Fault::FillDisk { .. } => "fill_disk",
            Fault::FreezeDisk { .. } => "freeze_disk",
        }
    }

    /// Whether it is a fault of the state directory's file system.
    pub fn is_disk(&self) -> bool {
        matches!(self, Fault::FillDisk { .. } | Fault::FreezeDisk { .. })
    }

    /// How long the fault lasts before it heals (0 for a kill: the restart follows at once).
    pub fn length_ms(&self) -> u64 {
        match self {
            Fault::Freeze { ms, .. }
            | Fault::Cut { ms, .. }
            | Fault::Blackhole { ms, .. }
            | Fault::FillDisk { ms }
            | Fault::FreezeDisk { ms } => *ms,
            _ => 0,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::KillManager => write!(f, "kill -9 the manager, restart it"),
            Fault::KillProxy(k) => write!(f, "kill -9 proxy {k}, restart it"),
            Fault::KillWorker(r) => write!(f, "kill -9 worker {r}, restart it"),
            Fault::Freeze { proxy: None, ms } => write!(f, "SIGSTOP the manager for {ms} ms"),
            Fault::Freeze { proxy: Some(k), ms } => write!(f, "SIGSTOP proxy {k} for {ms} ms"),
            Fault::Cut { node, ms } => write!(f, "cut node {node}'s link for {ms} ms"),
            Fault::Blackhole { node, ms } => write!(f, "blackhole node {node}'s link for {ms} ms"),
            Fault::FillDisk { ms } => write!(f, "fill the state directory's disk for {ms} ms"),
            Fault::FreezeDisk { ms } => {
                write!(f, "freeze the state directory's file system for {ms} ms")
            }
        }
    }
}

/// One target of a switch.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The node's index.
    pub node: u32,
    /// The device on it.
    pub device: u32,
    /// To its backup NIC (or back to the primary).
    pub backup: bool,
}

/// Where in a switch its fault lands.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LandAt {
    /// Before the switch is submitted (its admission's write meets it).
    Before,
    /// As soon as the manager accepted it.
    Accepted,
    /// When this phase of it starts.
    Phase(Phase),
}

impl fmt::Display for LandAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LandAt::Before => f.write_str("before"),
            LandAt::Accepted => f.write_str("accepted"),
            LandAt::Phase(p) => f.write_str(p.as_str()),
        }
    }
}

/// One step of a process schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// A switch of `targets` with uuid `id`; `fault` lands when phase `at` starts (`accepted`:
    /// as soon as the manager admits it).
    Switch {
        /// The uuid's bits.
        id: u128,
        /// What to switch.
        targets: Vec<Target>,
        /// When the fault lands.
        at: LandAt,
        /// The fault, if any.
        fault: Option<Fault>,
    },
    /// A fault between operations.
    Fault(Fault),
    /// The switch of step `of` again, with its uuid.
    Repeat {
        /// The index of the step.
        of: usize,
    },
    /// `recover --to as-is`.
    Recover,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Switch {
                targets, at, fault, ..
            } => {
                let t: Vec<String> = targets
                    .iter()
                    .map(|t| {
                        let side = if t.backup { "backup" } else { "primary" };
                        format!("node-{}/{}->{side}", t.node, t.device)
                    })
                    .collect();
                write!(f, "switch {}", t.join(" "))?;
                match fault {
                    Some(x) => write!(f, "; at {at}: {x}"),
                    None => Ok(()),
                }
            }
            Step::Fault(x) => write!(f, "{x}"),
            Step::Repeat { of } => write!(f, "repeat the uuid of step {of}"),
            Step::Recover => write!(f, "recover --to as-is"),
        }
    }
}

/// The points of a switch a fault may land at.
pub const PHASES: [LandAt; 5] = [
    LandAt::Accepted,
    LandAt::Phase(Phase::Sample),
    LandAt::Phase(Phase::Pause),
    LandAt::Phase(Phase::Switch),
    LandAt::Phase(Phase::Resume),
];

/// Where a fault of the state directory may land: before the switch is submitted (its
/// admission's write meets it), or as one of [`PHASES`] (its result's write does).
pub const DISK_PHASES: [LandAt; 6] = [
    LandAt::Before,
    LandAt::Accepted,
    LandAt::Phase(Phase::Sample),
    LandAt::Phase(Phase::Pause),
    LandAt::Phase(Phase::Switch),
    LandAt::Phase(Phase::Resume),
];

/// What the stream of the disk faults is seeded with, besides the seed.
const DISK_STREAM: u64 = 0xd15c_fa17_0000_0000;

/// One seed's schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcSchedule {
    /// The seed.
    pub seed: u64,
    /// The steps, in order.
    pub steps: Vec<Step>,
}

impl ProcSchedule {
    /// The schedule of `seed`: 3 to 5 steps.
    pub fn generate(seed: u64) -> ProcSchedule {
        let mut rng = SplitMix64::new(seed);
        let n = rng.range(3, 5);
        let mut steps: Vec<Step> = Vec::new();
        for _ in 0..n {
            let switches: Vec<usize> = (0..steps.len())
                .filter(|i| matches!(steps[*i], Step::Switch { .. }))
                .collect();
            let step = match rng.below(100) {
                0..=54 => switch(&mut rng),
                55..=74 => Step::Fault(fault(&mut rng)),
                75..=89 if !switches.is_empty() => Step::Repeat {
                    of: *rng.pick(&switches),
                },
                90..=99 => Step::Recover,
                _ => switch(&mut rng),
            };
            steps.push(step);
        }
        let mut disk = SplitMix64::new(seed ^ DISK_STREAM);
        if disk.chance(35) {
            steps.push(disk_switch(&mut disk));
        }
        ProcSchedule { seed, steps }
    }

    /// How many of its steps carry a fault.
    pub fn faults(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, Step::Fault(_) | Step::Switch { fault: Some(_), .. }))
            .count()
    }
}

fn switch(rng: &mut SplitMix64) -> Step {
    let backup = rng.chance(60);
    let mut targets = vec![Target {
        node: rng.below(NODES.into()) as u32,
        device: rng.below(PPN.into()) as u32,
        backup,
    }];
    if rng.chance(40) {
        // A second target on the other node: the switch crosses nodes.
        targets.push(Target {
            node: (targets[0].node + 1) % NODES,
            device: rng.below(PPN.into()) as u32,
            backup,
        });
    }
    let id = rng.next_u128();
    let at = *rng.pick(&PHASES);
    let fault = rng.chance(75).then(|| fault(rng));
    Step::Switch {
        id,
        targets,
        at,
        fault,
    }
}

/// A switch that meets a fault of the state directory's file system.
fn disk_switch(rng: &mut SplitMix64) -> Step {
    let Step::Switch { id, targets, .. } = switch(rng) else {
        unreachable!("switch() draws a switch")
    };
    let fault = if rng.chance(50) {
        Fault::FillDisk {
            ms: rng.range(300, 2000),
        }
    } else {
        // Longer than the campaign's journal timeout: the writes it meets time out.
        Fault::FreezeDisk {
            ms: rng.range(1200, 3000),
        }
    };
    let at = *rng.pick(&DISK_PHASES);
    Step::Switch {
        id,
        targets,
        at,
        fault: Some(fault),
    }
}

fn fault(rng: &mut SplitMix64) -> Fault {
    let node = rng.below(NODES.into()) as u32;
    match rng.below(100) {
        0..=16 => Fault::KillManager,
        17..=31 => Fault::KillProxy(node),
        32..=46 => Fault::KillWorker(rng.below((NODES * PPN).into()) as u32),
        47..=56 => Fault::Freeze {
            proxy: None,
            ms: rng.range(200, 2500),
        },
        57..=66 => Fault::Freeze {
            proxy: Some(node),
            ms: rng.range(200, 2500),
        },
        67..=83 => Fault::Cut {
            node,
            ms: rng.range(200, 3000),
        },
        _ => Fault::Blackhole {
            node,
            ms: rng.range(200, 3000),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_fixes_its_schedule() {
        assert_eq!(ProcSchedule::generate(7), ProcSchedule::generate(7));
        assert_ne!(ProcSchedule::generate(7), ProcSchedule::generate(8));
    }

    #[test]
    fn schedules_draw_every_kind_of_fault_and_step() {
        let mut kinds = std::collections::BTreeSet::new();
        let mut steps = std::collections::HashSet::new();
        for seed in 0..200 {
            let s = ProcSchedule::generate(seed);
            assert!((3..=6).contains(&s.steps.len()));
            for (i, st) in s.steps.iter().enumerate() {
                steps.insert(std::mem::discriminant(st));
                match st {
                    Step::Switch { fault: Some(f), .. } | Step::Fault(f) => {
                        kinds.insert(f.kind());
                    }
                    Step::Repeat { of } => assert!(*of < i),
                    _ => {}
                }
            }
        }
        assert_eq!(kinds.len(), 9, "{kinds:?}");
        assert_eq!(steps.len(), 4);
    }

    /// The disk faults come from a stream of their own: a seed's other steps are the ones
    /// it had before them (the seeds the tests chose keep their faults).
    #[test]
    fn disk_faults_are_added_after_a_seeds_own_steps() {
        let mut with_disk = 0;
        for seed in 0..200 {
            let s = ProcSchedule::generate(seed);
            let disk: Vec<usize> = (0..s.steps.len())
                .filter(
                    |i| matches!(&s.steps[*i], Step::Switch { fault: Some(f), .. } if f.is_disk()),
                )
                .collect();
            match disk.as_slice() {
                [] => {}
                [last] => {
                    assert_eq!(*last, s.steps.len() - 1, "seed {seed}");
                    with_disk += 1;
                }
                more => panic!("seed {seed}: {more:?}"),
            }
        }
        assert!((40..=100).contains(&with_disk), "{with_disk} of 200");
    }
}
