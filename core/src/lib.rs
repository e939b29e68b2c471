//! # taskd-core
//!
//! The pure heart of taskd: everything the control plane decides, with nothing it does.
//!
//! - [`auto`]: the automatic failover policy (when to move a device without an operator).
//! - [`ids`]: the names of things (job, node, device, global and group rank, operation id).
//! - [`rank_table`]: which `(node, device)` runs which global rank.
//! - [`command`]: the operator's switch command and its validation into typed errors.
//! - [`planner`]: how one rank turns a switch into HCCL calls, identically on every rank.
//! - [`hal`]: the two capabilities a device layer must offer (per rank, per node), and its
//!   error: a vendor-neutral kind with the vendor's code kept beside it.
//! - [`protocol`]: the messages manager, proxies and workers exchange.
//! - [`operation`]: the operation state machine (events in, actions and deadlines out).
//! - [`ledger`]: the manager's book of a job: registrations, NIC table, in-flight and past
//!   operations, and the admission rules in front of the state machine.
//! - [`summary`]: one operation as readers outside the manager see it (JSON, the control API).
//! - [`display`]: how lists appear in messages for people.
//! - [`env`]: the environment variables taskd reads, one lookup type for them, and how their
//!   values are interpreted.
//! - [`external`]: ClusterD as the driver of a job's switches: its signals, the reports it is
//!   owed, and the sequencer that ties them to one externally sequenced operation.
//!
//! No I/O (but [`env::process_env`], the lookup the binaries hand in), no runtime, no clock: time enters as [`std::time::Duration`] values handed in by the
//! caller, so every interleaving can be replayed in a unit or property test.

pub mod auto;
pub mod command;
pub mod display;
pub mod env;
pub mod external;
pub mod hal;
pub mod ids;
pub mod ledger;
pub mod operation;
pub mod planner;
pub mod protocol;
pub mod rank_table;
pub mod summary;
pub mod verify;

pub use command::{Direction, RankTarget, SwitchCommand, SwitchPlan, ValidationError};
pub use hal::{
    GroupInfo, HalError, HalErrorKind, HcclCode, Library, LinkHealth, NicSide, NodeHal, RankHal,
    StepBoundary, SwitchCapabilities, VendorCode,
};
pub use ids::{DeviceId, GlobalRank, GroupRank, JobId, NodeName, OperationId};
pub use ledger::{JobLedger, JobState, SubmitError};
pub use operation::{Action, Event, Operation, OperationReport, Outcome, PhaseDeadlines, Trigger};
pub use planner::{plan_calls, GroupCall};
pub use rank_table::RankTable;
pub use summary::OperationSummary;
