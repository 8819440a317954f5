//! libpq connection strings, both forms (`postgres://…?k=v` and
//! `k=v k='v v'`), split into what tokio-postgres parses itself and the
//! parameters it refuses or does not know (TLS files, the verify modes,
//! libpq's extra `target_session_attrs`), with libpq's `PG*` environment
//! fallbacks for whatever the string leaves out.

use std::collections::BTreeMap;

use crate::error::ConnectError;

/// Parameters this crate reads itself; tokio-postgres never sees them.
const OURS: &[&str] = &["sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "sslcrl", "sslsni"];

/// Parameters whose presence decides whether one of our defaults applies.
const WATCHED: &[&str] = &[
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "tcp_user_timeout",
    "connect_timeout",
    "application_name",
    "target_session_attrs",
    "options",
    "host",
    "hostaddr",
    "port",
    "user",
    "dbname",
    "password",
    "sslnegotiation",
];

/// libpq's environment variables for parameters a string may leave out.
const ENVIRONMENT: &[(&str, &str)] = &[
    ("host", "PGHOST"),
    ("hostaddr", "PGHOSTADDR"),
    ("port", "PGPORT"),
    ("dbname", "PGDATABASE"),
    ("user", "PGUSER"),
    ("password", "PGPASSWORD"),
    ("application_name", "PGAPPNAME"),
    ("connect_timeout", "PGCONNECT_TIMEOUT"),
    ("options", "PGOPTIONS"),
    ("target_session_attrs", "PGTARGETSESSIONATTRS"),
    ("sslmode", "PGSSLMODE"),
    ("sslrootcert", "PGSSLROOTCERT"),
    ("sslcert", "PGSSLCERT"),
    ("sslkey", "PGSSLKEY"),
    ("sslnegotiation", "PGSSLNEGOTIATION"),
];

/// A connection string taken apart.
#[derive(Clone)]
pub(crate) struct ConnInfo {
    /// What tokio-postgres parses: the string without our parameters.
    pub passed_on: String,
    /// Our parameters, and copies of the watched ones, by name.
    pub params: BTreeMap<String, String>,
    /// Parameters that came from `PG*` variables, to be set on the config
    /// after tokio-postgres parsed the string.
    pub from_environment: BTreeMap<String, String>,
}

impl ConnInfo {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.params.get(key).or_else(|| self.from_environment.get(key)).map(String::as_str)
    }

    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }
}

pub(crate) fn parse(input: &str, environment: &dyn Fn(&str) -> Option<String>) -> Result<ConnInfo, ConnectError> {
    let trimmed = input.trim();
    let (passed_on, mut params, uri_parts) =
        if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
            split_uri(trimmed)?
        } else {
            split_key_values(trimmed)?
        };
    let mut from_environment = BTreeMap::new();
    for (key, variable) in ENVIRONMENT {
        let given = params.contains_key(*key) || uri_parts.iter().any(|part| part == key);
        // A multi-host string names its hosts; PGHOSTADDR must not add one.
        let skip = *key == "hostaddr" && (params.contains_key("host") || uri_parts.iter().any(|p| p == "host"));
        if given || skip {
            continue;
        }
        if let Some(value) = environment(variable).filter(|v| !v.is_empty()) {
            from_environment.insert((*key).to_owned(), value);
        }
    }
    for part in uri_parts {
        params.entry(part).or_default();
    }
    Ok(ConnInfo { passed_on, params, from_environment })
}

type Split = (String, BTreeMap<String, String>, Vec<String>);

/// `postgres://user:pw@h1:1,h2:2/db?k=v`: our parameters are taken out of
/// the query; the authority and path stay as written. The last vector
/// names the parameters the authority and path gave, so the environment
/// does not override them.
fn split_uri(uri: &str) -> Result<Split, ConnectError> {
    let (base, query) = uri.split_once('?').unwrap_or((uri, ""));
    let rest = base.split_once("://").map(|(_, rest)| rest).unwrap_or_default();
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hosts) = authority.rsplit_once('@').map_or(("", authority), |(u, h)| (u, h));
    let mut given = Vec::new();
    if !userinfo.is_empty() {
        given.push("user".to_owned());
        if userinfo.contains(':') {
            given.push("password".to_owned());
        }
    }
    if !hosts.is_empty() {
        given.push("host".to_owned());
        if hosts.split(',').any(|host| host.rsplit_once(':').is_some_and(|(_, port)| !port.is_empty())) {
            given.push("port".to_owned());
        }
    }
    if !path.is_empty() {
        given.push("dbname".to_owned());
    }
    let mut params = BTreeMap::new();
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').ok_or_else(|| ConnectError::invalid(pair, "expected key=value"))?;
        let key = decode(key)?;
        let value = decode(value)?;
        if WATCHED.contains(&key.as_str()) {
            params.insert(key.clone(), value.clone());
        }
        if OURS.contains(&key.as_str()) {
            params.insert(key, value);
        } else if key == "target_session_attrs" {
            kept.push(format!("{key}={}", encode(&libpq_session_attrs(&value)?)));
        } else {
            kept.push(pair.to_owned());
        }
    }
    let passed_on = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
    Ok((passed_on, params, given))
}

/// `host=a port=5432 sslmode='verify-full'`: libpq's key/value form.
fn split_key_values(input: &str) -> Result<Split, ConnectError> {
    let mut params = BTreeMap::new();
    let mut kept = Vec::new();
    for (key, value) in key_values(input)? {
        if WATCHED.contains(&key.as_str()) {
            params.insert(key.clone(), value.clone());
        }
        if OURS.contains(&key.as_str()) {
            params.insert(key, value);
        } else if key == "target_session_attrs" {
            kept.push(format!("{key}={}", quote(&libpq_session_attrs(&value)?)));
        } else {
            kept.push(format!("{key}={}", quote(&value)));
        }
    }
    Ok((kept.join(" "), params, Vec::new()))
}

/// libpq's names for session attributes tokio-postgres spells differently
/// or checks the same way: `primary` is a server that accepts writes,
/// `standby` one that does not. `prefer-standby` needs a second pass over
/// the hosts that tokio-postgres does not make, so it is refused rather
/// than silently treated as `any`.
pub(crate) fn libpq_session_attrs(value: &str) -> Result<String, ConnectError> {
    match value {
        "any" | "read-write" | "read-only" => Ok(value.to_owned()),
        "primary" => Ok("read-write".to_owned()),
        "standby" => Ok("read-only".to_owned()),
        other => Err(ConnectError::invalid(
            "target_session_attrs",
            format!("{other:?} is not supported (use any, read-write, primary, read-only or standby)"),
        )),
    }
}

fn key_values(input: &str) -> Result<Vec<(String, String)>, ConnectError> {
    let mut pairs = Vec::new();
    let mut chars = input.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(ConnectError::invalid(&key, "expected key=value"));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                    None => return Err(ConnectError::invalid(&key, "unterminated quoted value")),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
}

fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

fn decode(text: &str) -> Result<String, ConnectError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3).ok_or_else(|| ConnectError::invalid(text, "bad percent-encoding"))?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| ConnectError::invalid(text, "bad percent-encoding"))?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ConnectError::invalid(text, "not UTF-8 once decoded"))
}

fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// `url` with any password replaced by `***`, in either form, for messages.
pub fn redact_url(url: &str) -> String {
    let trimmed = url.trim();
    if let Some((scheme, rest)) = trimmed.split_once("://") {
        let (base, query) = rest.split_once('?').map_or((rest, None), |(b, q)| (b, Some(q)));
        let (authority, path) = base.split_once('/').map_or((base, None), |(a, p)| (a, Some(p)));
        let authority = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***@{hosts}"),
                None => authority.to_owned(),
            },
            None => authority.to_owned(),
        };
        let base = path.map_or(authority.clone(), |path| format!("{authority}/{path}"));
        let query = query.map(|q| {
            q.split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) if key.eq_ignore_ascii_case("password") || key == "sslpassword" => {
                        format!("{key}=***")
                    }
                    _ => pair.to_owned(),
                })
                .collect::<Vec<_>>()
                .join("&")
        });
        return match query {
            Some(query) => format!("{scheme}://{base}?{query}"),
            None => format!("{scheme}://{base}"),
        };
    }
    match key_values(trimmed) {
        Ok(pairs) => pairs
            .into_iter()
            .map(|(key, value)| match key.as_str() {
                "password" | "sslpassword" => format!("{key}=***"),
                _ => format!("{key}={}", quote(&value)),
            })
            .collect::<Vec<_>>()
            .join(" "),
        Err(_) => "<connection string>".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn takes_tls_parameters_out_of_a_uri() {
        let info = parse(
            "postgres://u:p%40ss@h1:5432,h2:5433/db?sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.crt&application_name=x",
            &none,
        )
        .expect("parses");
        assert_eq!(info.passed_on, "postgres://u:p%40ss@h1:5432,h2:5433/db?application_name=x");
        assert_eq!(info.get("sslmode"), Some("verify-full"));
        assert_eq!(info.get("sslrootcert"), Some("/tmp/ca.crt"));
        assert_eq!(info.get("application_name"), Some("x"));
        assert!(info.has("host") && info.has("port") && info.has("user") && info.has("password"));
    }

    #[test]
    fn takes_tls_parameters_out_of_key_values() {
        let info = parse(r"host=a user=me password='it''s' sslmode = require sslcert='/x y/c.crt'", &none);
        assert!(info.is_err(), "'' is not libpq's escape for a quote");
        let info =
            parse(r"host=a user=me password='it\'s' sslmode = require sslcert='/x y/c.crt'", &none).expect("parses");
        assert_eq!(info.get("sslmode"), Some("require"));
        assert_eq!(info.get("sslcert"), Some("/x y/c.crt"));
        assert_eq!(info.passed_on, r"host='a' user='me' password='it\'s'");
    }

    #[test]
    fn the_environment_fills_only_what_the_string_left_out() {
        let env = |name: &str| match name {
            "PGHOST" => Some("envhost".to_owned()),
            "PGUSER" => Some("envuser".to_owned()),
            "PGSSLMODE" => Some("verify-ca".to_owned()),
            "PGPORT" => Some("6543".to_owned()),
            _ => None,
        };
        let info = parse("postgres://me@db.example/app", &env).expect("parses");
        assert_eq!(info.get("sslmode"), Some("verify-ca"));
        assert_eq!(info.from_environment.get("port").map(String::as_str), Some("6543"));
        assert!(!info.from_environment.contains_key("host"));
        assert!(!info.from_environment.contains_key("user"));
    }

    #[test]
    fn libpq_session_attributes_map_to_the_drivers() {
        let info = parse("postgres://h1,h2/db?target_session_attrs=primary", &none).expect("parses");
        assert_eq!(info.passed_on, "postgres://h1,h2/db?target_session_attrs=read-write");
        let refused = parse("host=a target_session_attrs=prefer-standby", &none);
        assert!(
            matches!(refused, Err(ConnectError::InvalidUrl { ref parameter, .. }) if parameter == "target_session_attrs")
        );
    }

    #[test]
    fn redaction_hides_passwords_in_both_forms() {
        assert_eq!(redact_url("postgres://u:secret@h/db?password=x&a=b"), "postgres://u:***@h/db?password=***&a=b");
        assert_eq!(redact_url("host=h password='s e'"), "host='h' password=***");
        assert!(!redact_url("postgresql://a:b@c").contains('b'));
    }
}
