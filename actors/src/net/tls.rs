//! TLS, one type ([`TlsPem`]) for every port. The transport is mutual: every process holds the
//! job's CA certificate, and a certificate and key signed by that CA. Servers require a client
//! certificate from that CA; clients verify the server's against it. One certificate can serve
//! both ways (a proxy is a server for its workers and a client of the manager) when it allows
//! both server and client authentication. The control port uses the same type, where the CA
//! (mutual TLS) and a client's certificate are optional.

use std::path::PathBuf;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read.
    #[error("cannot read the TLS {what} {path}: {source}")]
    Read {
        /// Which file: CA certificate, certificate or key.
        what: &'static str,
        /// Where it was looked for.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A file holds no PEM block.
    #[error("the TLS {what} {path} holds no PEM block")]
    NotPem {
        /// Which file.
        what: &'static str,
        /// Where it is.
        path: PathBuf,
    },
    /// The material is incomplete or tonic refused it.
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// Where the PEM files are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA that signs every certificate of the job.
    pub ca: PathBuf,
    /// This process's certificate (PEM).
    pub cert: PathBuf,
    /// This process's private key (PEM).
    pub key: PathBuf,
    /// The name to verify in the server's certificate (default: the host of its address).
    pub domain: Option<String>,
}

/// PEM material for one end of a TLS connection: the one TLS type of taskd, for the transport
/// between the roles (always mutual: [`TlsPem::mutual`], [`TlsFiles::load`]) and for the
/// control port and its clients (a CA and a client certificate are optional there).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsPem {
    /// The CA. A server with one requires client certificates signed by it (mutual TLS); a
    /// client verifies the server's certificate against it.
    pub ca: Option<Vec<u8>>,
    /// This end's certificate and key: required for a server, presented by a client when set.
    pub identity: Option<PemIdentity>,
    /// The name a client verifies in the server's certificate (default: the host it connects
    /// to).
    pub domain: Option<String>,
}

/// A certificate (PEM, with its chain) and its private key (PEM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PemIdentity {
    /// The certificate chain.
    pub cert: Vec<u8>,
    /// The private key.
    pub key: Vec<u8>,
}

/// The largest PEM file read: far above a certificate chain (a larger file is not one).
const MAX_PEM_BYTES: u64 = 1 << 20;

impl TlsFiles {
    /// Reads the three files (regular files only, read without blocking); each must hold a
    /// PEM block, and the key must be the certificate's (a mismatch is named here, at start,
    /// rather than as a failed handshake later).
    pub fn load(&self) -> Result<TlsPem, TlsError> {
        let read = |what: &'static str, path: &PathBuf| -> Result<Vec<u8>, TlsError> {
            let bytes = crate::files::read_regular(path, MAX_PEM_BYTES).map_err(|source| {
                TlsError::Read {
                    what,
                    path: path.clone(),
                    source,
                }
            })?;
            if !String::from_utf8_lossy(&bytes).contains("-----BEGIN") {
                return Err(TlsError::NotPem {
                    what,
                    path: path.clone(),
                });
            }
            Ok(bytes)
        };
        let mut pem = TlsPem::mutual(
            read("CA certificate", &self.ca)?,
            read("certificate", &self.cert)?,
            read("key", &self.key)?,
        );
        pem.domain = self.domain.clone();
        // Building a server's configuration parses the certificate and the key and checks
        // that they belong together.
        tonic::transport::Server::builder()
            .tls_config(pem.server_config()?)
            .map_err(|e| {
                TlsError::Config(format!(
                    "the certificate {} and the key {} do not make an identity: {}",
                    self.cert.display(),
                    self.key.display(),
                    crate::net::client::error_chain(&e)
                ))
            })?;
        Ok(pem)
    }
}

impl TlsPem {
    /// Mutual TLS: this CA on both sides, this certificate and key.
    pub fn mutual(ca: Vec<u8>, cert: Vec<u8>, key: Vec<u8>) -> TlsPem {
        TlsPem {
            ca: Some(ca),
            identity: Some(PemIdentity { cert, key }),
            domain: None,
        }
    }

    /// A server presenting its certificate; with a CA, it requires client certificates signed
    /// by that CA.
    pub fn server_config(&self) -> Result<ServerTlsConfig, TlsError> {
        let id = self
            .identity
            .as_ref()
            .ok_or_else(|| TlsError::Config("a TLS server needs a certificate and a key".into()))?;
        let mut c = ServerTlsConfig::new().identity(Identity::from_pem(&id.cert, &id.key));
        if let Some(ca) = &self.ca {
            c = c.client_ca_root(Certificate::from_pem(ca));
        }
        Ok(c)
    }

    /// A client that verifies the server against the CA and presents its own certificate
    /// when it has one. `server` is the `HOST:PORT` it connects to.
    pub fn client_config(&self, server: &str) -> ClientTlsConfig {
        let domain = self.domain.clone().unwrap_or_else(|| host_of(server));
        let mut c = ClientTlsConfig::new().domain_name(domain);
        if let Some(ca) = &self.ca {
            c = c.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some(id) = &self.identity {
            c = c.identity(Identity::from_pem(&id.cert, &id.key));
        }
        c
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
