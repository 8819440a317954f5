//! The archive's part of the store's policy: where to (`archive_url`),
//! which apps (`archive_apps`, NULL for all) and the file format version.
//! It lives in the policy row (`adk_store_policy`), so every change is in
//! the policy's change log with its time and role: the log says when
//! archiving began.

use diesel::QueryableByName;
use diesel::sql_types::{Array, Integer, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;

use crate::ArchiveError;
use crate::destination::check_url;
use crate::format::FORMAT_VERSION;
use adk_postgres_operations::first_row;

/// Whether and where days are archived before they are dropped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, QueryableByName)]
pub struct ArchivePolicy {
    /// `None`: archiving is off; a day past retention is dropped unarchived.
    #[diesel(sql_type = Nullable<Text>)]
    pub url: Option<String>,
    /// `None`: every app's events; else only these apps'.
    #[diesel(sql_type = Nullable<Array<Text>>)]
    pub apps: Option<Vec<String>>,
    /// The archive format new objects are written in.
    #[diesel(sql_type = Integer)]
    pub format_version: i32,
}

impl ArchivePolicy {
    /// Whether archiving is on: a destination is set.
    pub fn is_on(&self) -> bool {
        self.url.is_some()
    }

    /// Whether `app`'s days are archived before they are dropped.
    pub fn covers(&self, app: &str) -> bool {
        self.is_on() && self.apps.as_ref().is_none_or(|apps| apps.iter().any(|a| a == app))
    }
}

impl std::fmt::Display for ArchivePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.url, &self.apps) {
            (None, _) => f.write_str("archive off"),
            (Some(url), None) => write!(f, "archive every app to {url} (format {})", self.format_version),
            (Some(url), Some(apps)) => {
                write!(f, "archive apps {} to {url} (format {})", apps.join(", "), self.format_version)
            }
        }
    }
}

/// A change of the archive policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArchiveSetting {
    /// Stop archiving: days past retention are dropped unarchived again.
    Off,
    /// Archive to `url`, every app (`apps: None`) or the apps named.
    On {
        /// The destination: `file:///…` or `s3://bucket/prefix`.
        url: String,
        /// The apps to archive; `None` archives every app.
        apps: Option<Vec<String>>,
    },
}

/// The archive policy in force.
pub async fn read_archive_policy(conn: &mut AsyncPgConnection) -> Result<ArchivePolicy, ArchiveError> {
    diesel::sql_query(
        "SELECT archive_url AS url, archive_apps AS apps, archive_format AS format_version FROM adk_store_policy",
    )
    .load::<ArchivePolicy>(conn)
    .await
    .and_then(first_row)
    .map_err(ArchiveError::query("read the archive policy"))
}

/// Changes the archive policy; the policy's trigger logs the change. A URL
/// is checked before anything is written, and opened, so a policy never
/// names a destination this process cannot even build.
pub async fn set_archive_policy(
    conn: &mut AsyncPgConnection,
    setting: &ArchiveSetting,
) -> Result<ArchivePolicy, ArchiveError> {
    let (url, apps) = match setting {
        ArchiveSetting::Off => (None, None),
        ArchiveSetting::On { url, apps } => {
            check_url(url)?;
            if let Some(apps) = apps {
                if apps.is_empty() {
                    return Err(ArchiveError::InvalidInput {
                        field: "archive_apps",
                        reason: "name at least one app, or archive every app".into(),
                    });
                }
                if let Some(bad) = apps.iter().find(|a| a.is_empty() || a.chars().count() > 128) {
                    return Err(ArchiveError::InvalidInput {
                        field: "archive_apps",
                        reason: format!("app name {bad:?} must be 1 to 128 characters"),
                    });
                }
            }
            (Some(url.as_str()), apps.as_deref())
        }
    };
    diesel::sql_query(
        "UPDATE adk_store_policy SET archive_url = $1, archive_apps = $2, archive_format = $3
         RETURNING archive_url AS url, archive_apps AS apps, archive_format AS format_version",
    )
    .bind::<Nullable<Text>, _>(url)
    .bind::<Nullable<Array<Text>>, _>(apps)
    .bind::<Integer, _>(FORMAT_VERSION)
    .load::<ArchivePolicy>(conn)
    .await
    .and_then(first_row)
    .map_err(ArchiveError::query("change the archive policy"))
}
