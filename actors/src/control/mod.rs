//! The control API operators and AI platforms drive, served by the manager on its control
//! port:
//!
//! - ClusterD's `Recover` service (`proto/recover.proto`), wire-compatible, so a platform
//!   written against ClusterD works unchanged. Result codes: [`codes`].
//! - taskd's own `taskd.control.v1.Control` (`proto/control.proto`): job status with the NIC
//!   table and past results, and submit-and-wait.
//!
//! Both are guarded by [`guard::Guard`]: an optional bearer token, optional mutual TLS, and a
//! per-client rate limit.

pub mod codes;
pub mod convert;
pub mod guard;
pub mod server;

pub use guard::{GuardConfig, RateLimit};
pub use server::{serve, ControlServer, ControlTls, ServeError};

/// Generated from `proto/recover.proto` (no package, as ClusterD's).
pub mod recover {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/_.rs"));
}

/// Generated from `proto/control.proto`.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/taskd.control.v1.rs"));
}
