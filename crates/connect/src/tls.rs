//! libpq's `sslmode` on rustls. What each mode checks:
//!
//! | mode | TLS | chain checked | host name checked |
//! |---|---|---|---|
//! | `disable` | never | | |
//! | `allow` | only if plaintext is refused | when a root file is given | |
//! | `prefer` (default) | when the server offers it, plaintext again if TLS fails | when a root file is given | |
//! | `require` | always | when a root file is given | |
//! | `verify-ca` | always | yes | |
//! | `verify-full` | always | yes | yes |
//!
//! "When a root file is given" is libpq's rule: `require` with an
//! `sslrootcert` file (or `~/.postgresql/root.crt`) behaves as `verify-ca`.
//! `sslrootcert=system` means the platform's roots and, as in libpq 16,
//! makes `verify-full` the default and refuses weaker modes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::conninfo::ConnInfo;
use crate::error::{ConnectError, TlsFailure};

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
#[non_exhaustive]
pub enum SslMode {
    /// Plaintext only.
    Disable,
    /// Plaintext first; TLS when the server refuses plaintext.
    Allow,
    /// TLS first; plaintext when the server does not offer TLS or the TLS
    /// connection fails. The default.
    #[default]
    Prefer,
    /// TLS or nothing; the chain is checked only when there are roots
    /// (`sslrootcert`, or `~/.postgresql/root.crt`).
    Require,
    /// TLS, with the server's chain checked against `sslrootcert`.
    VerifyCa,
    /// `verify-ca`, and the certificate must name the host connected to.
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<Self, ConnectError> {
        Ok(match value {
            "disable" => Self::Disable,
            "allow" => Self::Allow,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => {
                return Err(ConnectError::invalid(
                    "sslmode",
                    format!("{other:?} is not one of disable, allow, prefer, require, verify-ca, verify-full"),
                ));
            }
        })
    }

    /// The mode as libpq spells it, such as `verify-full`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Allow => "allow",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }
}

/// Where trusted roots come from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Roots {
    File(PathBuf),
    System,
}

/// The TLS half of a connection's settings.
#[derive(Clone)]
pub(crate) struct Tls {
    pub mode: SslMode,
    /// Built once: loading roots and keys per connection would re-read files.
    pub config: Arc<ClientConfig>,
    /// Whether the server's chain is checked (verify modes, or a root file).
    pub verifies: bool,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("mode", &self.mode).field("verifies", &self.verifies).finish()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// libpq's default files under `~/.postgresql/`, when they exist.
fn default_file(home: Option<&str>, name: &str) -> Option<PathBuf> {
    let path = Path::new(home?).join(".postgresql").join(name);
    path.is_file().then_some(path)
}

pub(crate) fn from_conninfo(info: &ConnInfo, home: Option<&str>) -> Result<Tls, ConnectError> {
    let roots = match info.get("sslrootcert") {
        Some("system") => Some(Roots::System),
        Some(path) if !path.is_empty() => Some(Roots::File(PathBuf::from(path))),
        _ => default_file(home, "root.crt").map(Roots::File),
    };
    let mode = match info.get("sslmode") {
        Some(mode) => SslMode::parse(mode)?,
        None if roots == Some(Roots::System) => SslMode::VerifyFull,
        None => SslMode::Prefer,
    };
    if roots == Some(Roots::System) && mode != SslMode::VerifyFull {
        return Err(ConnectError::invalid(
            "sslmode",
            format!("sslrootcert=system needs sslmode=verify-full, not {}", mode.as_str()),
        ));
    }
    if info.get("sslpassword").is_some() {
        return Err(ConnectError::invalid("sslpassword", "encrypted client keys are not supported; decrypt the key"));
    }
    if info.get("sslcrl").is_some() {
        return Err(ConnectError::invalid("sslcrl", "certificate revocation lists are not supported"));
    }
    let explicit_roots = info.get("sslrootcert").is_some_and(|r| !r.is_empty());
    if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) && roots.is_none() {
        return Err(ConnectError::TlsFile {
            parameter: "sslrootcert",
            path: "~/.postgresql/root.crt".to_owned(),
            reason: format!("sslmode={} needs trusted roots: give sslrootcert=<file> or system", mode.as_str()),
        });
    }
    // libpq checks the chain in the weaker TLS modes too when roots were
    // given; a root file found only by default is ignored below verify-ca
    // when it cannot be read, as libpq ignores a missing one.
    let verifies = matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) || roots.is_some();
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| ConnectError::invalid("sslmode", e.to_string()))?;
    let verifier: Arc<dyn ServerCertVerifier> = match (&roots, mode) {
        (None, _) => Arc::new(NoVerification(provider())),
        (Some(roots), _) if mode != SslMode::Disable => {
            let store = match roots {
                Roots::File(path) => match load_roots(path) {
                    Ok(store) => store,
                    Err(e) if !explicit_roots && mode < SslMode::VerifyCa => {
                        tracing::warn!(error = %e, "ignoring the default root certificate file");
                        RootCertStore::empty()
                    }
                    Err(e) => return Err(e),
                },
                Roots::System => system_roots()?,
            };
            if store.is_empty() {
                Arc::new(NoVerification(provider()))
            } else {
                let inner =
                    WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider()).build().map_err(|e| {
                        ConnectError::TlsFile { parameter: "sslrootcert", path: describe(roots), reason: e.to_string() }
                    })?;
                Arc::new(ChainVerifier { inner, check_host: mode == SslMode::VerifyFull })
            }
        }
        _ => Arc::new(NoVerification(provider())),
    };
    let builder = builder.dangerous().with_custom_certificate_verifier(verifier);
    let cert = info.get("sslcert").map(PathBuf::from).or_else(|| default_file(home, "postgresql.crt"));
    let mut config = match cert {
        Some(cert_path) => {
            let key_path =
                info.get("sslkey").map(PathBuf::from).or_else(|| default_file(home, "postgresql.key")).ok_or_else(
                    || ConnectError::TlsFile {
                        parameter: "sslkey",
                        path: cert_path.display().to_string(),
                        reason: "a client certificate needs its key (sslkey)".into(),
                    },
                )?;
            let chain = CertificateDer::pem_file_iter(&cert_path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| file_error("sslcert", &cert_path, e))?;
            if chain.is_empty() {
                return Err(ConnectError::TlsFile {
                    parameter: "sslcert",
                    path: cert_path.display().to_string(),
                    reason: "no certificate in the file".into(),
                });
            }
            let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| file_error("sslkey", &key_path, e))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| ConnectError::TlsFile {
                parameter: "sslkey",
                path: key_path.display().to_string(),
                reason: e.to_string(),
            })?
        }
        None => builder.with_no_client_auth(),
    };
    if info.get("sslnegotiation") == Some("direct") {
        // Direct TLS (PostgreSQL 17+) is told apart from HTTPS by ALPN.
        config.alpn_protocols = vec![b"postgresql".to_vec()];
    }
    Ok(Tls { mode, config: Arc::new(config), verifies })
}

fn describe(roots: &Roots) -> String {
    match roots {
        Roots::File(path) => path.display().to_string(),
        Roots::System => "system".to_owned(),
    }
}

fn file_error(parameter: &'static str, path: &Path, error: impl std::fmt::Display) -> ConnectError {
    ConnectError::TlsFile { parameter, path: path.display().to_string(), reason: error.to_string() }
}

fn load_roots(path: &Path) -> Result<RootCertStore, ConnectError> {
    let mut store = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| file_error("sslrootcert", path, e))?;
    let (added, _ignored) = store.add_parsable_certificates(certs);
    if added == 0 {
        return Err(file_error("sslrootcert", path, "no usable certificate in the file"));
    }
    Ok(store)
}

fn system_roots() -> Result<RootCertStore, ConnectError> {
    let found = rustls_native_certs::load_native_certs();
    let mut store = RootCertStore::empty();
    let (added, _ignored) = store.add_parsable_certificates(found.certs);
    if added == 0 {
        let reason = found.errors.first().map_or("the platform has no trusted roots".to_owned(), |e| e.to_string());
        return Err(ConnectError::TlsFile { parameter: "sslrootcert", path: "system".into(), reason });
    }
    Ok(store)
}

/// `require` without roots: encrypted, the server's identity unchecked,
/// but its handshake signatures still verified (so the session key is the
/// one the certificate's holder made).
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The chain checked against the roots; the host name only for
/// `verify-full` (webpki checks the chain first, so a name mismatch is
/// the only error left to forgive for `verify-ca`).
#[derive(Debug)]
struct ChainVerifier {
    inner: Arc<WebPkiServerVerifier>,
    check_host: bool,
}

impl ServerCertVerifier for ChainVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_host => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The TLS reason inside a failed connect, if TLS was what failed.
pub(crate) fn failure_of(error: &tokio_postgres::Error, host: &str) -> Option<(TlsFailure, String)> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if let Some(rustls_error) = current.downcast_ref::<rustls::Error>() {
            return Some((classify(rustls_error, host), rustls_error.to_string()));
        }
        if let Some(io) = current.downcast_ref::<std::io::Error>()
            && let Some(rustls_error) = io.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some((classify(rustls_error, host), rustls_error.to_string()));
        }
        source = current.source();
    }
    // The driver's own TLS failures are told apart by their text, which
    // sits in the error's sources rather than its top line.
    let text = crate::error::with_causes(error);
    if text.contains("server does not support TLS") {
        return Some((TlsFailure::NotOffered, text));
    }
    if text.contains("TLS handshake") || text.contains("error performing TLS") {
        return Some((TlsFailure::Handshake, text));
    }
    None
}

fn classify(error: &rustls::Error, host: &str) -> TlsFailure {
    use rustls::AlertDescription;
    match error {
        rustls::Error::InvalidCertificate(cert) => match cert {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => TlsFailure::UnknownIssuer,
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. } => TlsFailure::Expired,
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                TlsFailure::WrongHost { host: host.to_owned() }
            }
            _ => TlsFailure::Handshake,
        },
        rustls::Error::AlertReceived(
            AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::AccessDenied,
        ) => TlsFailure::ClientCertificateRefused,
        _ => TlsFailure::Handshake,
    }
}
