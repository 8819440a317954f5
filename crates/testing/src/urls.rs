//! Deriving database URLs from a server URL.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs as _};

use url::{Host, Url};

use crate::error::HarnessError;

/// `server_url` with its database replaced by `database`; user, password,
/// host, port and query parameters stay.
pub(crate) fn with_database(server_url: &str, database: &str) -> Result<String, HarnessError> {
    let mut url = parse(server_url)?;
    url.set_path(&format!("/{database}"));
    Ok(url.into())
}

/// Whether the server runs on this machine, where a database's owner pid can
/// be checked in /proc. Another host's test processes are none of ours.
pub(crate) fn is_local(server_url: &str) -> bool {
    let Ok(url) = parse(server_url) else {
        return false;
    };
    match url.host() {
        None => true,
        // postgres:// is not a scheme the url crate knows, so it leaves IPv4
        // hosts as text. An empty host or a percent-encoded folder is a
        // Unix socket.
        Some(Host::Domain(domain)) => {
            domain.is_empty()
                || domain == "localhost"
                || domain.starts_with("%2F")
                || domain.starts_with("%2f")
                || domain.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
        }
        Some(Host::Ipv4(ip)) => ip.is_loopback(),
        Some(Host::Ipv6(ip)) => ip.is_loopback(),
    }
}

/// The TCP address of the server `server_url` names (its first host, port
/// 5432 unless given): what a proxy in front of it connects to.
pub(crate) fn server_address(server_url: &str) -> Result<SocketAddr, HarnessError> {
    let url = parse(server_url)?;
    let bad = |reason: String| HarnessError::BadUrl { url: redacted(server_url), reason };
    let host = url.host_str().filter(|host| !host.is_empty()).unwrap_or("localhost");
    let port = url.port().unwrap_or(5432);
    (host, port)
        .to_socket_addrs()
        .map_err(|error| bad(format!("{host}:{port} does not resolve: {error}")))?
        .next()
        .ok_or_else(|| bad(format!("{host}:{port} resolves to no address")))
}

/// The URL fit for an error message: any password replaced by `***`.
pub(crate) fn redacted(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.into()
        }
        Ok(_) => url.to_owned(),
        Err(_) => "(unparsable URL)".to_owned(),
    }
}

fn parse(server_url: &str) -> Result<Url, HarnessError> {
    let bad = |reason: String| HarnessError::BadUrl { url: server_url.to_owned(), reason };
    let url = Url::parse(server_url)
        .map_err(|error| bad(format!("{error} (expected postgres://user@host:port/postgres)")))?;
    if !matches!(url.scheme(), "postgres" | "postgresql") {
        return Err(bad("the scheme must be postgres:// or postgresql://".into()));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_is_replaced_and_the_rest_kept() {
        let url =
            with_database("postgres://u:p%40ss@db.example:6543/postgres?sslmode=disable", "adk_test_1_0_ab").unwrap();
        assert_eq!(url, "postgres://u:p%40ss@db.example:6543/adk_test_1_0_ab?sslmode=disable");
        let url = with_database("postgresql://postgres@127.0.0.1:5432", "x").unwrap();
        assert_eq!(url, "postgresql://postgres@127.0.0.1:5432/x");
    }

    #[test]
    fn key_value_strings_are_refused_with_the_expected_form() {
        let error = with_database("host=localhost user=postgres", "x").unwrap_err().to_string();
        assert!(error.contains("postgres://"), "{error}");
        assert!(with_database("mysql://localhost/x", "y").is_err());
    }

    #[test]
    fn passwords_stay_out_of_messages() {
        assert_eq!(redacted("postgres://u:secret@h:1/db"), "postgres://u:***@h:1/db");
        assert_eq!(redacted("postgres://u@h:1/db"), "postgres://u@h:1/db");
    }

    #[test]
    fn server_addresses_default_the_port_and_resolve_the_host() {
        assert_eq!(server_address("postgres://u@127.0.0.1:5433/db").unwrap(), "127.0.0.1:5433".parse().unwrap());
        assert_eq!(server_address("postgres://u@127.0.0.1/db").unwrap().port(), 5432);
        assert!(
            server_address("postgres://u:secret@no-such-host.invalid/db")
                .is_err_and(|e| !e.to_string().contains("secret"))
        );
    }

    #[test]
    fn locality() {
        assert!(is_local("postgres://postgres@127.0.0.1:5432/postgres"));
        assert!(is_local("postgres://postgres@localhost/postgres"));
        assert!(is_local("postgres://postgres@[::1]:5432/postgres"));
        assert!(is_local("postgres://%2Fvar%2Frun%2Fpostgresql/postgres"));
        assert!(is_local("postgres:///postgres?host=/tmp"));
        assert!(!is_local("postgres://postgres@10.1.2.3/postgres"));
        assert!(!is_local("postgres://postgres@db.example/postgres"));
    }
}
