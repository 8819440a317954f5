//! Certificates made at test time, and throwaway clusters that use them.
//!
//! The TLS tests need a CA the client trusts, a server certificate it
//! verifies, one it must refuse (expired, or from a CA it does not trust)
//! and client certificates for `clientcert=verify-full`. Checked-in
//! certificates would expire and would tempt someone to trust them; these
//! are made fresh by rcgen for every run, into a folder of the caller's.
//!
//! Every cluster the harness starts for the ordinary tests has TLS on with
//! such a PKI in its folder (and still accepts plaintext), so a test can ask
//! any harness server for a verified TLS URL ([`crate::TestDatabase::tls_url`]),
//! unless its build has no SSL: then it has no TLS, and the tests that need
//! TLS skip ([`crate::skip_without`]`(`[`crate::Capability::Tls`]`)`).

use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

use crate::cluster::{Cluster, Extras, find_server_binaries, run, running_as_root, throwaway_node_with};
use crate::error::HarnessError;

const DAY_SECONDS: u64 = 24 * 60 * 60;

/// Which server certificate a TLS cluster presents.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ServerCert {
    /// Signed by the CA, valid now, for `localhost` and `127.0.0.1`.
    #[default]
    Valid,
    /// Signed by the CA for the same names, but its validity ended yesterday.
    Expired,
}

/// What [`start_throwaway_tls_cluster`] sets up.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    pub server_cert: ServerCert,
    /// pg_hba.conf has `hostssl` lines only and rejects plaintext
    /// (`hostnossl … reject`).
    pub hostssl_only: bool,
    /// TLS connections must present a client certificate signed by the CA
    /// whose CN is the user (`clientcert=verify-full`); the authentication
    /// method stays `trust`.
    pub client_cert: bool,
    /// Names or addresses the server certificates carry besides `localhost`
    /// and `127.0.0.1`.
    pub extra_names: Vec<String>,
}

/// A CA, server certificates it signed, an unrelated "wrong" CA, and client
/// certificates made on demand; PEM files in one folder.
///
/// Server keys are mode 0600 and, when we are root, owned by `postgres`
/// (the server refuses a key anyone else could read); client keys are 0600
/// and ours (libpq and the connect crate refuse looser ones).
pub struct TestPki {
    dir: PathBuf,
    /// Signs the client certificates asked for later.
    ca: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestPki {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("TestPki").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl TestPki {
    /// Makes every file in `dir` (created if missing; files there are replaced).
    pub fn generate(dir: &Path, extra_names: &[String]) -> Result<Self, HarnessError> {
        std::fs::create_dir_all(dir).map_err(HarnessError::io(format!("creating {}", dir.display())))?;
        let (ca_cert_params, ca_key) = ca_params("adk-postgres test CA")?;
        write_pair(dir, "ca", &ca_cert_params.self_signed(&ca_key).map_err(cert_error)?.pem(), &ca_key, false)?;
        let ca = Issuer::new(ca_cert_params, ca_key);

        let (wrong_params, wrong_key) = ca_params("adk-postgres unrelated CA")?;
        let wrong = wrong_params.self_signed(&wrong_key).map_err(cert_error)?;
        write_pair(dir, "wrong-ca", &wrong.pem(), &wrong_key, false)?;

        let names: Vec<String> =
            ["localhost", "127.0.0.1"].into_iter().map(str::to_owned).chain(extra_names.iter().cloned()).collect();
        for (stem, from_days, until_days) in [("server", -1, 365), ("server-expired", -30, -1)] {
            let mut params = CertificateParams::new(names.clone()).map_err(cert_error)?;
            params.distinguished_name.push(DnType::CommonName, "localhost");
            params.extended_key_usages.push(ExtendedKeyUsagePurpose::ServerAuth);
            set_validity(&mut params, from_days, until_days);
            let (cert, key) = leaf(&params, &ca)?;
            write_pair(dir, stem, &cert, &key, true)?;
        }
        Ok(Self { dir: dir.to_path_buf(), ca })
    }

    /// A client certificate for `user` (its CN), signed by the CA, valid now:
    /// `(certificate, key)`. Made again on every call.
    pub fn client_cert(&self, user: &str) -> Result<(PathBuf, PathBuf), HarnessError> {
        let mut params = CertificateParams::new(Vec::new()).map_err(cert_error)?;
        params.distinguished_name.push(DnType::CommonName, user);
        params.extended_key_usages.push(ExtendedKeyUsagePurpose::ClientAuth);
        set_validity(&mut params, -1, 365);
        let (cert, key) = leaf(&params, &self.ca)?;
        let stem = format!("client-{}", user.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_"));
        write_pair(&self.dir, &stem, &cert, &key, false)?;
        Ok(self.files(&stem))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA's certificate: what a client passes as `sslrootcert`, and the
    /// server's `ssl_ca_file` for client certificates.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }

    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.crt")
    }

    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    pub fn expired_server_cert(&self) -> PathBuf {
        self.dir.join("server-expired.crt")
    }

    pub fn expired_server_key(&self) -> PathBuf {
        self.dir.join("server-expired.key")
    }

    /// A CA that signed nothing: a client trusting only it must refuse the server.
    pub fn wrong_ca_cert(&self) -> PathBuf {
        self.dir.join("wrong-ca.crt")
    }

    pub fn wrong_ca_key(&self) -> PathBuf {
        self.dir.join("wrong-ca.key")
    }

    /// The certificate and key a server presents for `choice`.
    pub fn server_files(&self, choice: ServerCert) -> (PathBuf, PathBuf) {
        match choice {
            ServerCert::Valid => (self.server_cert(), self.server_key()),
            ServerCert::Expired => (self.expired_server_cert(), self.expired_server_key()),
        }
    }

    fn files(&self, stem: &str) -> (PathBuf, PathBuf) {
        (self.dir.join(format!("{stem}.crt")), self.dir.join(format!("{stem}.key")))
    }
}

/// Starts a throwaway cluster with TLS as `options` say and a fresh PKI in
/// its folder (`pki/`); same lifecycle as [`crate::start_throwaway_cluster`]:
/// gone when the cluster is dropped or, failing that, soon after this process
/// exits. The PKI's files go with the cluster's folder.
///
/// [`HarnessError::Lacks`] when the server binaries were built without SSL;
/// a test that needs this cluster asks [`crate::skip_without`] first.
pub fn start_throwaway_tls_cluster(options: &TlsOptions) -> Result<(Cluster, TestPki), HarnessError> {
    let extras = Extras { tls: Some(options.clone()), tls_required: true, ..Extras::default() };
    let (cluster, pki) = throwaway_node_with(&find_server_binaries()?, false, extras)?;
    let pki = pki.ok_or_else(|| HarnessError::Setup("the TLS cluster was made without its PKI".into()))?;
    Ok((cluster, pki))
}

/// What a cluster's settings and pg_hba.conf say about TLS.
#[derive(Debug, Clone)]
pub(crate) struct ClusterTls {
    pub(crate) cert_file: PathBuf,
    pub(crate) key_file: PathBuf,
    pub(crate) ca_file: PathBuf,
    pub(crate) hostssl_only: bool,
    pub(crate) client_cert: bool,
}

impl ClusterTls {
    pub(crate) fn new(pki: &TestPki, options: &TlsOptions) -> Self {
        let (cert_file, key_file) = pki.server_files(options.server_cert);
        Self {
            cert_file,
            key_file,
            ca_file: pki.ca_cert(),
            hostssl_only: options.hostssl_only,
            client_cert: options.client_cert,
        }
    }

    /// The whole pg_hba.conf, or `None` when initdb's (trust on every TCP
    /// line, TLS or not) already says it.
    pub(crate) fn hba(&self) -> Option<String> {
        if !self.hostssl_only && !self.client_cert {
            return None;
        }
        let cert = if self.client_cert { " clientcert=verify-full" } else { "" };
        let mut hba =
            String::from("# Written by adk-postgres-testing.\nlocal all all trust\nlocal replication all trust\n");
        for address in ["127.0.0.1/32", "::1/128"] {
            hba.push_str(&format!(
                "hostssl all all {address} trust{cert}\nhostssl replication all {address} trust{cert}\n"
            ));
        }
        if self.hostssl_only {
            hba.push_str("hostnossl all all 0.0.0.0/0 reject\nhostnossl all all ::/0 reject\n");
        } else {
            for address in ["127.0.0.1/32", "::1/128"] {
                hba.push_str(&format!(
                    "hostnossl all all {address} trust\nhostnossl replication all {address} trust\n"
                ));
            }
        }
        Some(hba)
    }
}

/// Valid from `from_days` to `until_days` relative to now (negative: in the
/// past). In place because rcgen's date type is the `time` crate's, which it
/// does not re-export.
fn set_validity(params: &mut CertificateParams, from_days: i64, until_days: i64) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let at = |days: i64| {
        let offset = Duration::from_secs(days.unsigned_abs() * DAY_SECONDS);
        if days < 0 { now.saturating_sub(offset) } else { now + offset }
    };
    params.not_before = rcgen::date_time_ymd(1970, 1, 1) + at(from_days);
    params.not_after = rcgen::date_time_ymd(1970, 1, 1) + at(until_days);
}

fn ca_params(name: &str) -> Result<(CertificateParams, KeyPair), HarnessError> {
    let mut params = CertificateParams::new(Vec::new()).map_err(cert_error)?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    set_validity(&mut params, -1, 365);
    Ok((params, KeyPair::generate().map_err(cert_error)?))
}

/// A new key and its certificate from `params`, signed by `issuer`, as PEM.
fn leaf(params: &CertificateParams, issuer: &Issuer<'_, KeyPair>) -> Result<(String, KeyPair), HarnessError> {
    let mut params = params.clone();
    params.use_authority_key_identifier_extension = true;
    params.key_usages.push(KeyUsagePurpose::DigitalSignature);
    let key = KeyPair::generate().map_err(cert_error)?;
    let cert = params.signed_by(&key, issuer).map_err(cert_error)?;
    Ok((cert.pem(), key))
}

/// Writes `<stem>.crt` and `<stem>.key` (0600; the server's given to
/// `postgres` when we are root, which the server insists on).
fn write_pair(dir: &Path, stem: &str, cert: &str, key: &KeyPair, server_key: bool) -> Result<(), HarnessError> {
    let cert_path = dir.join(format!("{stem}.crt"));
    std::fs::write(&cert_path, cert).map_err(HarnessError::io(format!("writing {}", cert_path.display())))?;
    let key_path = dir.join(format!("{stem}.key"));
    let failed = HarnessError::io(format!("writing {}", key_path.display()));
    let write = || -> std::io::Result<()> {
        let mut file = OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&key_path)?;
        // A file that was already there keeps its mode through open().
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(key.serialize_pem().as_bytes())
    };
    write().map_err(failed)?;
    if server_key && running_as_root() {
        let mut chown = Command::new("chown");
        chown.arg("postgres:").arg(&key_path);
        run(chown)?;
    }
    Ok(())
}

fn cert_error(error: rcgen::Error) -> HarnessError {
    HarnessError::Setup(format!("making test certificates: {error}"))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use super::*;
    use crate::cluster::psql;

    const IN_TLS: &str = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()";

    /// The cluster, or `None` after reporting the skip when the server
    /// binaries have no SSL.
    fn tls_cluster(options: &TlsOptions) -> Option<(Cluster, TestPki)> {
        match start_throwaway_tls_cluster(options) {
            Ok(started) => Some(started),
            Err(HarnessError::Lacks { capability, .. }) => {
                crate::record_skip(capability);
                None
            }
            Err(error) => panic!("a TLS cluster: {error}"),
        }
    }

    fn refusal(result: Result<String, HarnessError>) -> String {
        match result {
            Ok(out) => panic!("connected: {out}"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn a_hostssl_only_cluster_wants_a_verified_client_certificate() {
        let options = TlsOptions { hostssl_only: true, client_cert: true, ..TlsOptions::default() };
        let Some((cluster, pki)) = tls_cluster(&options) else { return };
        let (cert, key) = pki.client_cert("postgres").unwrap();
        let (other_cert, other_key) = pki.client_cert("someone else").unwrap();
        let server = format!("port={} user=postgres dbname=postgres", cluster.port());
        let verified = format!("{server} host=localhost sslmode=verify-full sslrootcert={}", pki.ca_cert().display());
        let with = |cert: &Path, key: &Path| format!("{verified} sslcert={} sslkey={}", cert.display(), key.display());

        assert_eq!(psql(cluster.bin_dir(), &with(&cert, &key), IN_TLS).unwrap(), "t");
        let missing = pki.dir().join("none");
        assert!(
            refusal(psql(cluster.bin_dir(), &with(&missing, &missing), IN_TLS)).contains("valid client certificate")
        );
        assert!(
            refusal(psql(cluster.bin_dir(), &with(&other_cert, &other_key), IN_TLS)).contains("authentication failed")
        );
        let plaintext = format!("{server} host=127.0.0.1 sslmode=disable");
        assert!(refusal(psql(cluster.bin_dir(), &plaintext, IN_TLS)).contains("no encryption"));
        let wrong_ca = format!("{} sslrootcert={}", with(&cert, &key), pki.wrong_ca_cert().display());
        assert!(refusal(psql(cluster.bin_dir(), &wrong_ca, IN_TLS)).contains("certificate verify failed"));

        for file in [pki.server_key(), pki.expired_server_key(), key] {
            let metadata = std::fs::metadata(&file).unwrap();
            assert_eq!(metadata.mode() & 0o777, 0o600, "{}", file.display());
            if running_as_root() {
                let postgres_owned = file.starts_with(pki.dir()) && file.to_string_lossy().contains("server");
                assert_eq!(metadata.uid() != 0, postgres_owned, "{}", file.display());
            }
        }
    }

    #[test]
    fn an_expired_server_certificate_fails_verification_only() {
        let options = TlsOptions { server_cert: ServerCert::Expired, ..TlsOptions::default() };
        let Some((cluster, pki)) = tls_cluster(&options) else { return };
        let server = format!("host=localhost port={} user=postgres dbname=postgres", cluster.port());
        let verified = format!("{server} sslmode=verify-full sslrootcert={}", pki.ca_cert().display());
        assert!(refusal(psql(cluster.bin_dir(), &verified, IN_TLS)).contains("certificate verify failed"));
        assert_eq!(psql(cluster.bin_dir(), &format!("{server} sslmode=require"), IN_TLS).unwrap(), "t");
    }

    #[test]
    fn the_ordinary_throwaway_cluster_takes_tls_and_plaintext() {
        let cluster = crate::start_throwaway_cluster().unwrap();
        let Some(ca) = cluster.ca_file() else {
            // Only a build without SSL goes without.
            let ssl_library = cluster.query_value("SHOW ssl_library").unwrap();
            assert_eq!(ssl_library, "", "a build with SSL ({ssl_library}) got no TLS");
            crate::record_skip(crate::Capability::Tls);
            return;
        };
        let ca = ca.display().to_string();
        let server = format!("port={} user=postgres dbname=postgres", cluster.port());
        let verified = format!("{server} host=localhost sslmode=verify-full sslrootcert={ca}");
        assert_eq!(psql(cluster.bin_dir(), &verified, IN_TLS).unwrap(), "t");
        let plaintext = format!("{server} host=127.0.0.1 sslmode=disable");
        assert_eq!(psql(cluster.bin_dir(), &plaintext, IN_TLS).unwrap(), "f");
        assert_eq!(cluster.query_value("SELECT current_setting('ssl_ca_file')").unwrap(), ca);
    }
}
