//! What the ledger runs now: nothing, an [`Operation`], or a verification round. The two
//! exclude each other (both hold every rank at its step gate), so [`Activity`] owns whichever
//! runs, and [`Activity::check_idle`] is the one `Busy` refusal.

use super::SubmitError;
use crate::ids::OperationId;
use crate::operation::Operation;
use crate::verify::Verification;

/// What runs now: at most one operation or verification round (each boxed: both are large
/// and the ledger is mostly idle).
#[derive(Debug, Default)]
pub(crate) enum Activity {
    /// Nothing runs.
    #[default]
    Idle,
    /// An operation (switch, recovery, sequenced) runs.
    Operating(Box<Operation>),
    /// A verification round asks every rank what it applied.
    Verifying(Box<Verification>),
}

impl Activity {
    /// The operation running, if one does.
    pub(crate) fn operation(&self) -> Option<&Operation> {
        match self {
            Activity::Operating(op) => Some(op.as_ref()),
            _ => None,
        }
    }

    /// The operation running, if one does, to give it an event or a command.
    pub(crate) fn operation_mut(&mut self) -> Option<&mut Operation> {
        match self {
            Activity::Operating(op) => Some(op.as_mut()),
            _ => None,
        }
    }

    /// The verification round running, if one does.
    pub(crate) fn verification(&self) -> Option<&Verification> {
        match self {
            Activity::Verifying(v) => Some(v.as_ref()),
            _ => None,
        }
    }

    /// Whether nothing runs.
    pub(crate) fn is_idle(&self) -> bool {
        matches!(self, Activity::Idle)
    }

    /// The id of what runs (an operation's or a round's).
    pub(crate) fn id(&self) -> Option<OperationId> {
        match self {
            Activity::Idle => None,
            Activity::Operating(op) => Some(op.id()),
            Activity::Verifying(v) => Some(v.id()),
        }
    }

    /// Refuses something new while anything runs ([`SubmitError::Busy`], naming the id to wait
    /// for).
    pub(crate) fn check_idle(&self) -> Result<(), SubmitError> {
        match self.id() {
            Some(in_flight) => Err(SubmitError::Busy { in_flight }),
            None => Ok(()),
        }
    }
}
