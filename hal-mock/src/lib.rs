//! # taskd-hal-mock
//!
//! A simulated Ascend fabric for testing the taskd control plane without hardware: nodes of
//! NPU dies, one NIC port per die, HCCL communication groups with each member's view of the
//! group's NIC configuration, and a simulated training loop. It is a simulator, not a stub:
//! the same control-plane code runs against it as against real HCCL, and it enforces HCCL's
//! rules for `HcclCommWorkingDevNicSet` so that a wrong protocol fails here the way it would
//! fail (or hang) on a real cluster.
//!
//! - [`Fabric`]: topology, links, groups, processes, fault injection, and
//!   [`Fabric::check_consistency`], the invariant every test ends with.
//! - [`MockRankHal`] / [`MockNodeHal`]: the [`taskd_core::RankHal`] and
//!   [`taskd_core::NodeHal`] a worker and a proxy own.
//! - [`SimTraining`]: one task per rank running all-reduces that wait for every peer and
//!   calling the step hook, so pausing, deadlocks and lost steps are observable; ranks are
//!   tasks on a small runtime, so a job of 16,384 ranks fits in one process.
//! - [`ScriptedRankHal`]: a [`taskd_core::RankHal`] that plays a script of expected calls
//!   ([`Expect`]), for tests of one worker's conversation with HCCL, embedded-hal-mock style.
//! - [`solo`]: one rank alone in its own process (`taskd worker --sim`): the same group layout,
//!   its own view of each group, HCCL's single-rank rules, a training loop on a common clock.
//!
//! - [`fault`]: what a test can make a NIC-set call do (fail, hang, be slow), and the record of
//!   every call.
//!
//! ## Where it sits
//!
//! The traits it implements, and the contract it simulates, are `taskd-core`'s
//! ([`taskd_core::hal`], explained in `docs/hal.md`); `taskd-hal-ascend` implements the same
//! traits over the real libraries. The actors of `taskd-actors` cannot tell the two apart,
//! which is the point: `taskd sim` (the `taskd` crate's `src/sim/`) runs the production
//! manager, proxies and workers on a [`Fabric`], `taskd worker --sim` and `taskd proxy --node-hal sim`
//! run one role on a [`solo`] rank or node, and the scenario tests under the workspace's
//! `tests/` end with [`Fabric::check_consistency`].
//!
//! ## Where to start reading
//!
//! [`fabric`] (the state and its invariant), then [`hccl`] (each rule as a rendezvous and the
//! code a broken rule returns), then [`operator`] (what a switch does not move). [`rank_hal`]
//! and [`node_hal`] are thin: they translate trait calls into those. [`training`] is the load
//! the control plane has to pause.
//!
//! ## The simulated hardware
//!
//! Rank `r` runs on node `r / D`, device `r % D` (node names `node-{i}`, as
//! [`taskd_core::RankTable::uniform`] lays them out). Devices are physical ids, as everywhere in
//! the control plane; the simulated nodes renumber nothing, so logical ids are the same. Each device owns one physical NIC port:
//! its primary NIC. Its backup NIC is its partner die's port
//! ([`taskd_core::DeviceId::partner`]); the last device of an odd-sized node has none. A rank on
//! its backup NIC sends on its partner's port, so two partners both on backup swap ports.
//! Groups: the world group `hccl_world_group`, tensor-parallel `tp_{i}` (consecutive chunks of
//! `tp_size` ranks) and data-parallel `dp_{j}` (ranks with index `j` in their chunk), members in
//! ascending global rank.
//!
//! ## The HCCL rules enforced
//!
//! See [`hccl`] for the rendezvous semantics and the return code of each broken rule. Rule
//! violations a correct control plane never commits are also recorded in
//! [`Fabric::violations`]. [`operator`] models HCCL's per-operator NIC rule (a NIC set reaches
//! only the operators a group had issued; new operators start on the default NIC) and defines
//! what "consistent" means under it.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod call;
pub mod fabric;
pub mod fault;
pub mod hccl;
pub mod inflight;
pub mod node_hal;
pub mod operator;
pub mod rank_hal;
pub mod scripted;
pub mod solo;
pub mod training;
mod view;

#[cfg(test)]
mod test_support;

pub use fabric::{
    Activity, ConsistencyReport, Fabric, FabricConfig, GroupDisagreement, NIC_SET_LOG_LEN,
    WORLD_GROUP,
};
pub use fault::{NicSetFault, NicSetRecord};
pub use hccl::{ALL_REDUCE_OP, NIC_SET_OP};
pub use node_hal::MockNodeHal;
pub use operator::{Collective, CollectiveKind};
pub use rank_hal::MockRankHal;
pub use scripted::{Expect, ScriptedRankHal};
pub use solo::{SoloLayout, SoloNodeHal, SoloRank, SoloRankHal, SoloTraining, SoloTrainingOptions};
pub use training::{
    no_pause_hooks, Hold, NoPause, RankExit, SimTraining, StepHook, TrainingOptions,
    TrainingSummary,
};

/// The simulated hardware's own library, `mock`, where it stands for no vendor library (a node
/// or device the fabric does not have, a scripted failure). It has no codes: its simulated HCCL
/// answers with HCCL's (`taskd_core::HcclCode`).
pub static MOCK: taskd_core::CodeTable =
    taskd_core::CodeTable::new(taskd_core::LibraryName::new("mock"), &[]);
