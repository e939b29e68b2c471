//! The simulator: a whole job in one process on the simulated fabric of `taskd-hal-mock`,
//! behind `taskd sim` (and the fault campaign, the benches and most scenario tests).
//!
//! ## Where to start reading
//!
//! [`Simulation`] wires the job; [`run_scenario`] runs `taskd sim`'s default scenario on it and
//! judges it; [`ScenarioReport`](report::ScenarioReport) is what it prints.
//!
//! ## Modules
//!
//! - [`simulation`]: the simulated job, its configuration and its final state, with the
//!   invariants every run is judged by.
//! - [`scenario`]: the default scenario (two operations, to backup and back) and the dispatch
//!   to the automatic failover one ([`auto`]).
//! - [`auto`]: `taskd sim --auto-failover`, a script of link events under the policy.
//! - [`launcher`]: the nodes' launchers of a job with process recovery, which take the
//!   manager's orders (restart every process, or end the job).
//! - [`report`]: the JSON contract and the table of a scenario's outcome.
//! - [`progress`]: the live rendering of an operation's phases (also `taskd switch --wait`'s).
//! - [`timeline`]: which phase each training step overlapped (`--timeline`, the per-step CSV).
//!
//! `taskd sim --serve` (the simulated job as a live rig) is the CLI's (`cli/serve.rs`): it is
//! flags and a run loop over [`Simulation`], and the simulator does not depend on the CLI.

pub mod auto;
pub mod launcher;
pub mod progress;
pub mod report;
pub mod scenario;
pub mod simulation;
pub mod timeline;

pub use report::ScenarioRun;
pub use scenario::{run_scenario, run_scenario_observed};
pub use simulation::*;
