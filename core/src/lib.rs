//! # taskd-core
//!
//! The pure heart of taskd: everything the control plane decides, with nothing it does.
//!
//! No I/O (but [`env::process_env`], the lookup the binaries hand in), no runtime, no clock:
//! time enters as [`std::time::Duration`] values handed in by the caller, so every
//! interleaving can be replayed in a unit or property test (`tests/operation_props.rs`,
//! `tests/recovery_props.rs` of this crate).
//!
//! ## Where it sits
//!
//! Every other crate builds on this one and leaves the decisions here: `taskd-actors` runs
//! the manager, proxy and worker roles as actors that move the messages of [`protocol`], feed
//! events to the [`ledger`] and carry out the [`Action`]s it returns; `taskd-hal-mock` (simulated) and `taskd-hal-ascend` (real HCCL and DCMI)
//! implement the [`hal`] traits; the `taskd` binary parses commands into [`SwitchCommand`]s
//! and prints [`OperationSummary`]s. `docs/protocol.md` tells the operation protocol in prose
//! (roles, a switch phase by phase, verification and recovery, the step gate's rules);
//! `docs/hal.md` the device contract and HCCL's rules behind the [`planner`].
//!
//! ## Where to start reading
//!
//! [`operation`]: its module docs draw the state machine of one switch, and [`Operation`] is
//! the type everything else serves. Then [`ledger`] (the admission rules in front of it) and
//! [`protocol`] (what crosses the wire). [`planner`] and [`hal`] are the device side.
//!
//! ## Modules
//!
//! - [`ids`]: the names of things (job, node, device, global and group rank, operation id).
//! - [`rank_table`]: which `(node, device)` runs which global rank.
//! - [`command`]: the operator's switch command and its validation into typed errors.
//! - [`planner`]: how one rank turns a switch into HCCL calls, identically on every rank.
//! - [`hal`]: the two capabilities a device layer must offer (per rank, per node), and its
//!   error: a vendor-neutral kind with the vendor's code kept beside it.
//! - [`protocol`]: the messages manager, proxies and workers exchange.
//! - [`operation`]: the operation state machine (events in, actions and deadlines out).
//! - [`verify`]: the verification round, how a manager learns what every rank applied when it
//!   did not watch (a start, a lost process, a recovery).
//! - [`ledger`]: the manager's book of a job: registrations, NIC table, in-flight and past
//!   operations, and the admission rules in front of the state machine.
//! - [`summary`]: one operation as readers outside the manager see it (JSON, the control API).
//! - [`display`]: how lists appear in messages for people.
//! - [`env`](mod@env): the environment variables taskd reads, one lookup type for them, and how
//!   their values are interpreted.
//! - [`clusterd`]: ClusterD as the driver of a job's switches: its signals, the reports it is
//!   owed, and the sequencer that ties them to one externally sequenced operation.
//! - [`auto`]: the automatic failover policy (when to move a device without an operator).
//! - [`inflight`]: where an aborted group's collectives stood and the point every member
//!   redoes them from (an operation that moves the job inside a step).

#![forbid(unsafe_code)]

pub mod assessment;
pub mod auto;
pub mod clusterd;
pub mod command;
pub mod display;
pub mod env;
pub mod hal;
pub mod ids;
pub mod inflight;
pub mod job_state;
pub mod ledger;
pub mod operation;
pub mod planner;
pub mod protocol;
pub mod rank_table;
pub mod summary;
pub mod verify;

pub use command::{Direction, RankTarget, SwitchCommand, SwitchPlan, ValidationError};
pub use hal::{
    CodeTable, GroupInfo, GroupsFuture, HalError, HalErrorKind, HalFuture, HcclCode, HcclSetup,
    LibraryName, LinkHealth, Missing, NicSide, NodeHal, RankHal, SideState, StepBoundary,
    StepOutcome, SwitchCapabilities, TaskRankHal, VendorCode, VendorStatus,
};
pub use ids::{DeviceId, GlobalRank, GroupRank, Instance, JobId, NodeName, OperationId};
pub use ledger::{JobLedger, JobState, SubmitError};
pub use operation::{Action, Event, Operation, OperationReport, Outcome, PhaseDeadlines, Trigger};
pub use planner::{plan_calls, GroupCall};
pub use rank_table::RankTable;
pub use summary::OperationSummary;
