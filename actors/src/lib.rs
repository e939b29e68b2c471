//! # taskd-actors
//!
//! The three roles of a taskd job as actix actors, and the transports between them.
//!
//! - [`Manager`] (one per job): admits commands, runs the operation state machine of
//!   `taskd-core`, broadcasts directives, keeps the NIC table and the results.
//! - [`Proxy`] (one per node): relays directives to the node's workers and fans their replies
//!   in, so the manager deals with nodes, not ranks; reads the node's link health.
//! - [`Worker`] (one per training process): owns the rank's HAL (calls strictly sequential; a
//!   blocking HAL on a thread of its own, [`ThreadedRankHal`]) and the [`StepGate`] the
//!   training loop calls at every step boundary.
//!
//! Actors talk only through [`transport::Link`]s, so the same actors run in one process
//! ([`LocalJob`], the simulator's and tests' default) or across machines ([`net`]: gRPC,
//! one process per role, and [`RemoteWorker`], the worker API for training processes).
//! [`process`] starts and stops each role as a process of its own. In a MindCluster cluster
//! the manager is also ClusterD's client ([`clusterd`]).
//!
//! ## Where it sits
//!
//! Below: `taskd-core` decides everything (the ledger and the operation state machine, the
//! planner, the protocol's messages); an actor here owns that state, feeds it the messages and
//! deadlines that arrive, and carries out the actions it returns. The device layer arrives as
//! `taskd-core`'s `RankHal` / `NodeHal` trait objects: this crate never names an
//! implementation (`taskd-hal-mock` simulates one, `taskd-hal-ascend` binds the real
//! libraries). Above: the `taskd` binary parses flags, starts roles through [`process`] and
//! [`net`] (`taskd manager|proxy|worker`), runs a [`LocalJob`] for `taskd sim`, and talks to a
//! manager through [`control`]'s client (`taskd switch|status|recover`). `docs/protocol.md` tells the protocol these actors run
//! (phases, fan-in, verification, the transport's sessions); `docs/hal.md` what a worker may
//! ask of its HAL.
//!
//! ## Where to start reading
//!
//! [`manager`], [`proxy`] and [`worker`]: one actor per file, its state and its
//! `Handler<M>`s, the messages next to it. [`gate`] is the one piece of concurrency a
//! training loop touches, with its deadlock argument in the module docs. Then [`local`] to see
//! them wired in one process, and [`net`] for the same wiring over gRPC.
//!
//! ## Modules
//!
//! - [`manager`], [`proxy`], [`worker`]: the actors.
//! - [`gate`]: the step gate between a worker and its training loop.
//! - [`transport`]: [`transport::Link`] and the in-process transport. Its
//!   [`Sender`](transport::Sender) trait is the sending half of a link, the end an actor
//!   holds.
//! - [`local`]: a whole job in one process.
//! - [`background`]: the one way a role, a server or a job runs on a thread of its own (a
//!   tokio runtime or an actix system), stopped and joined by its handle.
//! - [`files`]: reading the files a role is given without blocking (regular files only).
//! - [`journal`]: the manager's journal of finished operations, so a repeated uuid survives a
//!   manager's restart.
//! - [`net`]: the network transport and a process per role (`proto/net.proto`).
//! - [`control`]: the operators' API on the manager's control port, ClusterD-compatible
//!   (`proto/control.proto`, `proto/clusterd.proto`).
//! - [`clusterd`]: the manager as ClusterD's client (`proto/clusterd.proto`).
//! - `manager/auto.rs`: automatic failover, wired into the manager.
//! - [`process`]: role startup and shutdown for the binaries.
//! - [`progress`]: the manager's feed of what an operation is doing, as it happens.
//! - [`telemetry`]: metric names and the `/metrics` endpoint. The manager's spans, metrics and
//!   progress events come from a private observer fed by the actor's events, so the actor
//!   keeps only the job's state.

#![forbid(unsafe_code)]

pub mod background;
pub mod clusterd;
pub mod control;
pub mod files;
pub mod gate;
pub mod hal_exec;
mod hang_watch;
pub mod journal;
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

/// Milliseconds since the Unix epoch, now: the origin of a job's step clock (an in-process
/// job's, the network manager's epoch) and the age of a proxy's view of it.
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub use gate::StepGate;
pub use hal_exec::{HalPanicked, ThreadedRankHal};
pub use local::{
    IntoRankSpec, LocalJob, LocalJobConfig, LocalJobError, LocalJobOptions, NodeLaunchers,
    RankParts, RankSpec, RecoveryResult,
};
pub use manager::{Manager, ManagerStatus};
pub use net::{RemoteWorker, RemoteWorkerConfig};
pub use progress::{ProgressEvent, ProgressFeed, ProgressKind};
pub use proxy::Proxy;
pub use worker::Worker;
