//! `adk-pg sessions --app A`: an app's sessions across its users, for
//! support and admin work, through the store's app-wide listing (so the
//! database decides who may list the app, as for every store call).

use std::process::ExitCode;

use adk_postgres_domain::session::MAX_PAGE_SIZE;
use adk_postgres_domain::{AppName, ListAppSessions, SessionStore as _, SessionSummary};
use adk_postgres_storage::{PgSessionStore, PoolConfig, TenantScope};
use anyhow::{Context, Result};
use chrono::Utc;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use serde_json::json;

use crate::args::SessionsArgs;

pub async fn list(url: &str, args: SessionsArgs) -> Result<ExitCode> {
    let app = AppName::new(args.app.as_str())?;
    let mut request = ListAppSessions::new(app);
    request.labels = args.labels.into_iter().collect();
    request.updated_after = args.updated_since.map(|t| t.with_timezone(&Utc));
    request.validate_filters()?;
    let limit = usize::try_from(args.limit).unwrap_or(usize::MAX);
    let pool = PoolConfig { max_size: 1, application_name: "adk-pg sessions".into(), ..PoolConfig::default() };
    // Per request: the owner lists any app, a service role only the apps it
    // is bound to.
    let store = PgSessionStore::connect(url, &pool, Default::default())
        .await
        .context("connect")?
        .with_tenant_scope(TenantScope::PerRequest);
    let mut sessions: Vec<SessionSummary> = Vec::new();
    let mut more = false;
    loop {
        request.page_size = Some((limit - sessions.len()).min(MAX_PAGE_SIZE));
        let page = store.list_app_sessions(&request).await.context("list the app's sessions")?;
        sessions.extend(page.sessions);
        match page.next_page_token {
            Some(token) if sessions.len() < limit => request.page_token = Some(token),
            Some(_) => {
                more = true;
                break;
            }
            None => break,
        }
    }
    if args.json {
        let rows: Vec<_> = sessions
            .iter()
            .map(|s| {
                json!({
                    "user_id": s.key.user_id.as_str(),
                    "session_id": s.key.session_id.as_str(),
                    "display_name": s.metadata.display_name,
                    "labels": s.metadata.labels,
                    "version": s.version,
                    "created_at": s.created_at.to_rfc3339(),
                    "last_update_time": s.last_update_time.to_rfc3339(),
                    "expires_at": s.expires_at.map(|t| t.to_rfc3339()),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&json!({ "app_name": args.app, "sessions": rows, "more": more }))?);
    } else {
        let mut table = Table::new();
        table.load_style(UTF8_FULL_CONDENSED).set_header([
            "user",
            "session",
            "name",
            "labels",
            "version",
            "created",
            "last updated",
        ]);
        for s in &sessions {
            let labels: Vec<String> = s.metadata.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            table.add_row([
                s.key.user_id.to_string(),
                s.key.session_id.to_string(),
                s.metadata.display_name.clone().unwrap_or_default(),
                labels.join(", "),
                s.version.to_string(),
                s.created_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                s.last_update_time.format("%Y-%m-%d %H:%M:%S").to_string(),
            ]);
        }
        println!("{table}");
        println!("{} session(s) of app {}", sessions.len(), args.app);
        if more {
            eprintln!("more sessions follow: raise --limit to see them");
        }
    }
    Ok(ExitCode::SUCCESS)
}
