//! Mutual TLS for the transport: every process holds the job's CA certificate, and a
//! certificate and key signed by that CA. Servers require a client certificate from that CA;
//! clients verify the server's against it. One certificate can serve both ways (a proxy is a
//! server for its workers and a client of the manager) when it allows both server and client
//! authentication.

use std::path::PathBuf;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the TLS {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the TLS {what} {path} holds no PEM block")]
    NotPem { what: &'static str, path: PathBuf },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// Where the PEM files are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA that signs every certificate of the job.
    pub ca: PathBuf,
    /// This process's certificate (PEM) and key.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The name to verify in the server's certificate (default: the host of its address).
    pub domain: Option<String>,
}

/// The PEM contents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsPem {
    pub ca: Vec<u8>,
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub domain: Option<String>,
}

impl TlsFiles {
    pub fn load(&self) -> Result<TlsPem, TlsError> {
        let read = |what: &'static str, path: &PathBuf| -> Result<Vec<u8>, TlsError> {
            let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
                what,
                path: path.clone(),
                source,
            })?;
            if !String::from_utf8_lossy(&bytes).contains("-----BEGIN") {
                return Err(TlsError::NotPem {
                    what,
                    path: path.clone(),
                });
            }
            Ok(bytes)
        };
        Ok(TlsPem {
            ca: read("CA certificate", &self.ca)?,
            cert: read("certificate", &self.cert)?,
            key: read("key", &self.key)?,
            domain: self.domain.clone(),
        })
    }
}

impl TlsPem {
    /// A server that requires client certificates signed by the CA.
    pub fn server_config(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert, &self.key))
            .client_ca_root(Certificate::from_pem(&self.ca))
    }

    /// A client that verifies the server against the CA and presents its own certificate.
    /// `server` is the `HOST:PORT` it connects to.
    pub fn client_config(&self, server: &str) -> ClientTlsConfig {
        let domain = self.domain.clone().unwrap_or_else(|| host_of(server));
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .identity(Identity::from_pem(&self.cert, &self.key))
            .domain_name(domain)
    }
}

/// `HOST` of `HOST:PORT` (brackets of an IPv6 literal removed).
fn host_of(server: &str) -> String {
    let host = server.rsplit_once(':').map_or(server, |(h, _)| h);
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn host_of_addresses() {
        assert_eq!(host_of("127.0.0.1:9601"), "127.0.0.1");
        assert_eq!(host_of("[::1]:9601"), "::1");
        assert_eq!(host_of("manager.example:9601"), "manager.example");
    }
}
