//! `taskd chaos --processes`: the fault campaign on jobs whose every role is a `taskd`
//! process, over the real gRPC transport on loopback.
//!
//! - [`schedule`]: a seed's schedule of switches and faults (kill -9, SIGSTOP, link cuts and
//!   blackholes, a full or frozen state directory), drawn from the seed alone;
//! - [`job`]: the job's processes (a manager, a proxy per node, a worker per rank), their
//!   links through fault relays, and its state directory;
//! - [`run`]: carries a schedule out and checks the invariants from outside;
//! - [`children`]: the processes a campaign started, ended on every way out;
//! - [`disk`]: a state directory on a file system of its own, to fill up or freeze.

pub mod children;
pub mod disk;
pub mod job;
pub mod run;
pub mod schedule;
