//! # taskd-roles
//!
//! The options of taskd's three roles and the configuration each one runs: what `taskd
//! manager`, `taskd proxy` and `taskd worker` parse from their command line, and what the
//! embedded roles of `taskd-capi` (`libtaskd.so`) parse from a JSON configuration whose keys
//! are the same flags. Written once, so a flag, its range and its default are the same in both.
//!
//! ## Where it sits
//!
//! Between `taskd-actors` (which starts and runs the roles, and knows neither clap nor a HAL
//! crate) and its two front ends, the `taskd` binary and the C ABI. It picks the node HAL of a
//! proxy by one value, `--node-hal` ([`NodeHalKind`]: DCMI from `taskd-hal-ascend`, Linux
//! interfaces from `taskd-hal-linux`, simulated link health from `taskd-hal-mock`). It prints
//! nothing but the metrics endpoint's address (what it notices on the way, a node HAL it
//! cannot open, goes to the `tracing` log), and never exits the process: every refusal is a
//! [`ConfigError`] the front end reports in its own way.
//!
//! ## Where to start reading
//!
//! [`ManagerArgs::config`], [`ProxyArgs::config`], [`WorkerArgs::config`]: flags and
//! environment in, an `actors` configuration out. [`flags`] holds every range.
//!
//! ## Modules
//!
//! - [`manager`], [`proxy`], [`worker`]: each role's options.
//! - [`net`]: the transport, TLS and metrics options the three share.
//! - [`auto`]: the automatic failover policy's options (the manager's and `taskd sim`'s).
//! - [`flags`]: the limits of the flags and the value parsers that enforce them.
//! - [`error`]: why a configuration cannot run.

pub mod auto;
pub mod error;
pub mod flags;
pub mod manager;
pub mod net;
pub mod proxy;
pub mod worker;

pub use auto::AutoArgs;
pub use error::ConfigError;
pub use manager::ManagerArgs;
pub use net::{say, NetArgs, TlsArgs};
pub use proxy::{NodeHalKind, ProxyArgs};
pub use worker::WorkerArgs;
