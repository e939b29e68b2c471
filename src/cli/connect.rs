//! How the operator's commands reach a manager's control port: address, bearer token, TLS.

use super::error::CliError;
use clap::Args;
use std::path::PathBuf;
use taskd_actors::control::{ClientError, ControlClient};
use taskd_actors::net::{PemIdentity, TlsPem};
pub use taskd_roles::manager::control_token;

/// The control address the Python package's manager (`start_taskd_manager()`) serves by
/// default, on loopback.
pub const DEFAULT_CONTROL_ADDR: &str = "127.0.0.1:9603";

/// Where the control API is and how to authenticate.
#[derive(Args, Clone, Debug)]
pub struct ConnectArgs {
    /// The manager's control address, HOST:PORT (default: where the Python package's manager
    /// serves it on its own host).
    #[arg(long, value_name = "HOST:PORT", value_parser = super::flags::host_port,
          default_value = DEFAULT_CONTROL_ADDR)]
    pub addr: String,
    /// File holding the bearer token (or set TASKD_CONTROL_TOKEN).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// CA certificate (PEM) to verify the server; turns on TLS.
    #[arg(long, value_name = "PEM")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Client key (PEM) for mutual TLS.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Server name to verify in its certificate (default: the host of --addr).
    #[arg(long, value_name = "NAME")]
    pub tls_domain: Option<String>,
}

/// A failure to reach or authenticate with the control API.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// A token, certificate or key file named by a flag could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file, as given on the command line.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The client could not be built or the server could not be reached.
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// The most of a certificate or key file read.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// A certificate or key file: a regular file only, read without blocking.
fn read(path: &std::path::Path) -> Result<Vec<u8>, ConnectError> {
    taskd_actors::files::read_regular(path, MAX_PEM_BYTES).map_err(|source| ConnectError::Read {
        path: path.to_owned(),
        source,
    })
}

impl ConnectArgs {
    /// The token from `--token-file` or `TASKD_CONTROL_TOKEN`.
    pub fn token(&self) -> Result<Option<String>, String> {
        control_token(self.token_file.as_deref())
    }

    /// The TLS material of `--tls-ca` / `--tls-cert` / `--tls-key` / `--tls-domain`; `None`
    /// (plain HTTP/2) when neither a CA nor a certificate is given.
    fn tls(&self) -> Result<Option<TlsPem>, ConnectError> {
        if self.tls_ca.is_none() && self.tls_cert.is_none() {
            return Ok(None);
        }
        let identity = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(PemIdentity {
                cert: read(cert)?,
                key: read(key)?,
            }),
            _ => None,
        };
        Ok(Some(TlsPem {
            ca: self.tls_ca.as_deref().map(read).transpose()?,
            identity,
            domain: self.tls_domain.clone(),
        }))
    }

    /// A client of the control API at `--addr` that sends `token` with every call.
    pub async fn connect(&self, token: Option<String>) -> Result<ControlClient, ConnectError> {
        let tls = self.tls()?;
        Ok(ControlClient::connect(&self.addr, tls.as_ref())
            .await?
            .with_token(token))
    }

    /// [`ConnectArgs::connect`] with [`ConnectArgs::token`], failing as the operator's commands
    /// do: a token that cannot be read is bad input ([`CliError::Usage`]); an address, TLS
    /// file or server that cannot be used is [`CliError::Unreachable`].
    pub async fn client(&self) -> Result<ControlClient, CliError> {
        let token = self.token().map_err(CliError::Usage)?;
        self.connect(token).await.map_err(|e| match e {
            ConnectError::Client(ClientError::Connect { .. }) => {
                CliError::Unreachable(format!("{e} (is the manager running and is --addr right?)"))
            }
            e => CliError::Unreachable(e.to_string()),
        })
    }
}

/// A failed control call as the operator's commands report it: an unknown job is
/// [`CliError::Failed`] (exit 1), a request the server calls malformed is [`CliError::Usage`]
/// (exit 2), anything else (not reachable, credentials refused, rate-limited, manager gone) is
/// [`CliError::Unreachable`] (exit 3). The message says what to do ([`explain`]).
pub fn call_error(e: ClientError) -> CliError {
    match e {
        ClientError::Rpc(s) => match s.code() {
            tonic::Code::NotFound => CliError::Failed(explain(&s)),
            tonic::Code::InvalidArgument => CliError::Usage(explain(&s)),
            _ => CliError::Unreachable(explain(&s)),
        },
        ClientError::Refused { code, reason, .. } => CliError::CommandRefused { code, reason },
        other => CliError::Unreachable(other.to_string()),
    }
}

/// A one-line message for a failed RPC, with what to do about it.
pub fn explain(status: &tonic::Status) -> String {
    use tonic::Code;
    let hint = match status.code() {
        Code::Unauthenticated => " (pass --token-file or set TASKD_CONTROL_TOKEN)",
        Code::ResourceExhausted => " (slow down: the control port rate-limits each client)",
        Code::Unavailable => " (is the manager running and is --addr right?)",
        Code::NotFound => " (check --job)",
        _ => "",
    };
    format!("{}{hint}", status.message())
}
