//! # taskd
//!
//! Moves a running Ascend training job's traffic onto backup NICs and back (link failover and
//! switchback) without stopping the job or losing a step.
//!
//! This facade re-exports the crates a launcher links ([`core`], [`actors`], [`hal_mock`]) and
//! holds what the `taskd` binary runs beyond starting roles: the command line ([`cli`]), the
//! simulator ([`sim`], with automatic failover in [`sim::auto`], and the fault campaign
//! [`chaos`]), the node preflight ([`doctor`]) and the hardware-in-the-loop rig
//! ([`rig`]).
//!
//! ## Where it sits
//!
//! The workspace is layered. `taskd-core` (here [`core`]) is pure: every decision of the
//! control plane, no I/O. `taskd-actors` ([`actors`]) runs it as the manager, proxy and worker
//! actors, over an in-process or a gRPC transport, with the operators' control API and role
//! startup. Below them, the device layer: `taskd-hal-mock` ([`hal_mock`], a simulated fabric
//! enforcing HCCL's rules) and `taskd-hal-ascend` (the real HCCL, ACL and DCMI, loaded at run
//! time). This crate is the top: it parses flags, picks a HAL, and prints. `docs/protocol.md`
//! describes the protocol the roles run; `docs/hal.md` the device contract and HCCL's rules;
//! the README and its pages in docs/ every command, flag and output.
//!
//! ## Where to start reading
//!
//! [`cli`]: one file per subcommand, each returning its exit code or a `CliError` that
//! [`cli::finish`] prints. For the control plane itself, read `taskd-core`'s front page next,
//! then `taskd-actors`'. [`sim`] shows a whole job wired in one process, end to end.
//!
//! ## Modules
//!
//! - [`cli`]: the `taskd` command line; `src/main.rs` only calls [`cli::main`].
//! - [`sim`]: `taskd sim`, a simulated job through a switch to backup and back, with the
//!   invariants every run is judged by; [`sim::report`] is its JSON contract and table,
//!   [`sim::progress`] the live rendering of an operation's phases, [`sim::timeline`] the
//!   per-step CSV.
//! - [`doctor`]: `taskd doctor`, the checks a node must pass before a job can switch.
//! - [`rig`]: one node's real NPUs training under the production control plane, switched and
//!   measured (`examples/hil_rig.rs` is its command line; with stub libraries in the tests).

#![forbid(unsafe_code)]

pub use taskd_actors as actors;
pub use taskd_core as core;
pub use taskd_hal_mock as hal_mock;

pub mod chaos;
pub mod cli;
pub mod doctor;
pub mod rig;
pub mod sim;
