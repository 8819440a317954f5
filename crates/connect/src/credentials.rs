//! Passwords asked for on every new connection, so short-lived tokens (RDS
//! IAM, Cloud SQL IAM, Entra ID) rotate without a restart.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A password or token. Its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a password or token so it is never printed.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value itself, for the one place that sends it to the server.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Why a provider could not give a password; its message must not hold the
/// secret (it is logged and returned to callers).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct CredentialError {
    /// What went wrong, without the secret.
    pub message: String,
}

impl CredentialError {
    /// An error with this message, which must not hold the secret.
    pub fn new(message: impl Into<String>) -> Self {
        Self { message: message.into() }
    }
}

/// What [`PasswordProvider::password`] returns: the password, or why
/// there is none.
pub type PasswordFuture = Pin<Box<dyn Future<Output = Result<Secret, CredentialError>> + Send>>;

/// Asked for the password each time a connection is opened (never while a
/// statement waits: pools open connections ahead of need).
pub trait PasswordProvider: Send + Sync + 'static {
    /// The password for the connection being opened now.
    fn password(&self) -> PasswordFuture;
}

impl<F, Fut> PasswordProvider for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Secret, CredentialError>> + Send + 'static,
{
    fn password(&self) -> PasswordFuture {
        Box::pin(self())
    }
}

/// A shared provider, as the config keeps it.
pub type SharedPasswordProvider = Arc<dyn PasswordProvider>;
