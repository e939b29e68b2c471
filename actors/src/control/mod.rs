//! The control API operators and AI platforms drive, served by the manager on its control
//! port (the only operator surface: the transport port carries the job's own traffic only):
//!
//! - ClusterD's `Recover` service (its operator API, `proto/clusterd.proto`), wire-compatible
//!   and answering as ClusterD does ([`recover`]), so a platform written against ClusterD works unchanged.
//! - taskd's own `taskd.control.v1.Control` (`proto/control.proto`, `taskd_service.rs`): job
//!   status with the NIC table, lost ranks and past results, waiting for registrations, and
//!   submit-and-wait with the phases as they happen ([`ControlClient`] is its typed client).
//!
//! `server.rs` serves both on one port (the guard, TLS, connection limits).
//!
//! Result codes: [`codes`]. Every service sits behind one [`guard::Guard`] interceptor (an
//! optional bearer token and a per-client rate limit); TLS, optionally mutual, is the port's.

pub mod client;
pub mod codes;
pub mod convert;
pub mod guard;
pub mod recover;
pub mod retention;
pub mod server;
mod taskd_service;

pub use client::{ClientError, ControlClient, Progress, Switching};
pub use guard::{Guard, GuardConfig, RateLimit};
pub use retention::{Clock, ManualClock, RESULT_RETENTION};
pub use server::{serve, ControlConfig, ControlServer, ServeError};

/// Generated from `proto/control.proto`.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/taskd.control.v1.rs"));
}
