//! Why a role's options and its environment cannot run. The `taskd` binary reports it as bad
//! input (exit 2); the C ABI as `TASKD_ERR_CONFIG`.

use taskd_actors::net::TlsError;
use taskd_actors::process::rank_table::RankTableFileError;
use taskd_actors::process::IdentityError;
use taskd_actors::telemetry::MetricsError;
use taskd_core::env::EnvError;
use taskd_core::rank_table::RankTableError;

/// Why a role's configuration is refused before anything starts.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The options or the environment are wrong in a way the flags' parser cannot see.
    #[error("{0}")]
    Usage(String),
    /// An environment variable is set to something unusable.
    #[error(transparent)]
    Env(#[from] EnvError),
    /// The rank table file cannot be used.
    #[error(transparent)]
    RankTable(#[from] RankTableFileError),
    /// The job's size is zero or above the maximum.
    #[error(transparent)]
    JobSize(#[from] RankTableError),
    /// The TLS files cannot be used.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The proxy cannot tell which node it is.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The metrics endpoint cannot be served.
    #[error("metrics endpoint: {0}")]
    Metrics(#[from] MetricsError),
}

impl ConfigError {
    /// A [`ConfigError::Usage`] from anything printable.
    pub fn usage(message: impl Into<String>) -> ConfigError {
        ConfigError::Usage(message.into())
    }
}
