//! # taskd-actors
//!
//! The three roles of a taskd job as actix actors, and the transports between them.
//!
//! - [`Manager`] (one per job): admits commands, runs the operation state machine of
//!   `taskd-core`, broadcasts directives, keeps the NIC table and the results.
//! - [`Proxy`] (one per node): relays directives to the node's workers and fans their replies
//!   in, so the manager deals with nodes, not ranks; reads the node's link health.
//! - [`Worker`] (one per training process): owns the rank's HAL (on a thread of its own, calls
//!   strictly sequential; [`hal_exec`] for processes that host many simulated ranks) and the
//!   [`StepGate`] the training loop calls at every step boundary.
//!
//! Actors talk only through [`transport::Link`]s, so the same actors run in one process
//! ([`LocalJob`], the simulator's and tests' default) or across machines ([`net`]: gRPC,
//! one process per role, and [`RemoteWorker`], the worker API for training processes).
//! [`process`] starts and stops each role as a process of its own.

pub mod control;
pub mod gate;
pub mod hal_exec;
pub mod local;
pub mod manager;
pub mod net;
mod observer;
pub mod process;
pub mod progress;
pub mod proxy;
pub mod telemetry;
pub mod transport;
pub mod worker;

pub use gate::StepGate;
pub use hal_exec::{HalPool, TaskRankHal, WorkerHal};
pub use local::{LocalJob, LocalJobConfig, LocalJobError, RankParts, RankSpec, RecoveryResult};
pub use manager::{Manager, ManagerStatus};
pub use net::{RemoteWorker, RemoteWorkerConfig};
pub use progress::{ProgressEvent, ProgressFeed, ProgressKind};
pub use proxy::Proxy;
pub use worker::Worker;
