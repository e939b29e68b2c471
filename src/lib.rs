//! # taskd
//!
//! Moves a running Ascend training job's traffic onto backup NICs and back (link failover and
//! switchback) without stopping the job or losing a step.
//!
//! This facade re-exports the crates a launcher links ([`core`], [`actors`], [`hal_mock`]) and
//! holds the simulator ([`sim`], with automatic failover in [`auto_sim`]) that the `taskd sim`
//! command runs.

pub use taskd_actors as actors;
pub use taskd_core as core;
pub use taskd_hal_mock as hal_mock;

pub mod auto_sim;
pub mod chaos;
pub mod cli;
pub mod doctor;
pub mod progress;
pub mod report;
pub mod rig;
pub mod sim;
pub mod timeline;
