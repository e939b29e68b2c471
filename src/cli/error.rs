//! The one error type of the `taskd` subcommands and the exit code each kind maps to. A
//! subcommand returns `Err(CliError)`; [`super::main`] prints it once, as
//! `taskd SUBCOMMAND: MESSAGE` on stderr, and exits with [`CliError::exit_code`].

use crate::sim::SimError;
use taskd_actors::net::NetError;
use taskd_actors::process::ProcessError;
use taskd_core::env::AddressError;
use taskd_roles::ConfigError;

/// Exit codes of the `taskd` commands (the pages in docs/ list them per command).
pub mod exit {
    /// Success (for `switch` without `--wait`: accepted).
    pub const OK: u8 = 0;
    /// The run or the operation failed (or was refused by the manager), or a role stopped
    /// for a reason other than a signal.
    pub const FAILED: u8 = 1;
    /// Bad input: the command line, the environment, a file it names; or a registration the
    /// manager or proxy refused for good.
    pub const USAGE: u8 = 2;
    /// The control API could not be reached, or refused the credentials.
    pub const UNREACHABLE: u8 = 3;
    /// `switch --wait`: the operation succeeded, but the manager could not write its result to
    /// its journal, so a restarted manager would not know it (and would run its uuid again).
    /// Not 0, so automation notices; not 1, so it does not retry a switch that happened.
    pub const NOT_RECORDED: u8 = 4;
}

/// Why a subcommand stopped without doing its job.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The command line or the environment is wrong in a way the flags' parser cannot see.
    #[error("{0}")]
    Usage(String),
    /// An address is not `HOST:PORT`.
    #[error(transparent)]
    Address(#[from] AddressError),
    /// The manager or the proxy refused this process for good.
    #[error("{0}")]
    Refused(String),
    /// A role could not start (a port taken, ...).
    #[error(transparent)]
    Start(#[from] ProcessError),
    /// The simulator could not run.
    #[error(transparent)]
    Sim(#[from] SimError),
    /// The control API could not be reached, or refused the credentials.
    #[error("{0}")]
    Unreachable(String),
    /// The manager refused an operator's command; nothing ran.
    #[error("refused ({code} {}): {reason}", taskd_actors::control::codes::name(*code))]
    CommandRefused {
        /// The control API's code (`taskd_actors::control::codes`).
        code: i32,
        /// Why, in the manager's words (naming the bad node, device, job, ...).
        reason: String,
    },
    /// A role's flags or environment cannot run.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Anything else that stops the command.
    #[error("{0}")]
    Failed(String),
}

impl CliError {
    /// The process's exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_)
            | CliError::Address(_)
            | CliError::Config(_)
            | CliError::Refused(_) => exit::USAGE,
            CliError::Sim(SimError::Setup(_) | SimError::Target(_)) => exit::USAGE,
            // A --state-dir whose journal cannot be used: the operator moves it away.
            CliError::Start(ProcessError::Journal(_)) => exit::USAGE,
            // TLS material the server cannot use (the message names the cause).
            CliError::Start(ProcessError::Net(NetError::Tls(_))) => exit::USAGE,
            CliError::Start(_)
            | CliError::Sim(_)
            | CliError::Failed(_)
            | CliError::CommandRefused { .. } => exit::FAILED,
            CliError::Unreachable(_) => exit::UNREACHABLE,
        }
    }

    /// A [`CliError::Usage`] from anything printable.
    pub fn usage(message: impl Into<String>) -> CliError {
        CliError::Usage(message.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use taskd_actors::net::NetError;

    #[test]
    fn bad_input_is_2_and_failures_are_1() {
        let env = taskd_core::env::EnvError {
            var: "MS_NODE_RANK",
            value: "-1".into(),
            expected: "a non-negative integer",
        };
        // An environment the roles cannot use reaches the command as the roles' error.
        assert_eq!(
            CliError::from(ConfigError::from(env)).exit_code(),
            exit::USAGE
        );
        assert_eq!(CliError::usage("x").exit_code(), exit::USAGE);
        assert_eq!(CliError::Refused("no".into()).exit_code(), exit::USAGE);
        assert_eq!(
            CliError::from(SimError::Setup("x".into())).exit_code(),
            exit::USAGE
        );
        let bind = NetError::Bind {
            addr: "0.0.0.0:1".into(),
            source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        assert_eq!(
            CliError::from(ProcessError::from(bind)).exit_code(),
            exit::FAILED
        );
        assert_eq!(CliError::Failed("x".into()).exit_code(), exit::FAILED);
    }

    #[test]
    fn a_refused_command_is_1_and_names_the_code() {
        let e = CliError::CommandRefused {
            code: taskd_actors::control::codes::PARAMETER_INVALID,
            reason: "no node node-9".into(),
        };
        assert_eq!(e.exit_code(), exit::FAILED);
        assert_eq!(
            e.to_string(),
            format!(
                "refused ({} PARAMETER_INVALID): no node node-9",
                taskd_actors::control::codes::PARAMETER_INVALID
            )
        );
        assert_eq!(
            CliError::Unreachable("x".into()).exit_code(),
            exit::UNREACHABLE
        );
    }
}
