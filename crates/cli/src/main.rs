//! `adk-pg`, the operator's tool: one binary to migrate, set the store's
//! policy, keep partitions ahead of the clock, retire old days, expire
//! sessions, convert a live event table, build indexes without blocking
//! writes, roll up and query usage, report health, serve metrics and a
//! dashboard (`serve`), and erase a user (`erase-user`).
//!
//! Exit codes: 0 success, 1 failure, 2 `status` found something to alert
//! on, or a single `rollup` run could not advance past in-flight writers.

#![warn(missing_docs)]

mod args;
mod render;
mod sessions;

use std::pin::Pin;
use std::process::ExitCode;

use adk_postgres_archive::{ArchiveSetting, StoreOptions, read_archive_policy, set_archive_policy};
use adk_postgres_dashboard::{ServeConfig, Server, TOKEN_VAR};
use adk_postgres_operations::connect;
use adk_postgres_retention::{
    ConvertProgress, HealthThresholds, IndexProgress, LockPolicy, MaintenanceConfig, conversion_plan, convert_events,
    create_partitioned_index, expire_sessions, health, policy_settings, run_maintenance, store_policy,
};
use adk_postgres_rollup::{GroupBy, Resolution, RollupConfig, UsageQuery, run_rollup, usage_at};
use adk_postgres_storage::policy::amend_policy_settings;
use adk_postgres_storage::{
    AppBinding, PolicyAmendment, ServiceRoleOptions, policy_changes, setup_service_role, show_service_role,
};
use adk_postgres_storage::{EraseOptions, EraseProgress, EraseStep, PgSessionStore, PoolConfig, TenantScope};
use anyhow::{Context, Result};
use args::{
    ArchiveCommand, Cli, Command, EraseUserArgs, FeedSwitch, MaintainArgs, PolicyCommand, PolicySetArgs, RollupArgs,
    ServeArgs, ThresholdArgs, UsageArgs, time_arg,
};
use chrono::{NaiveDate, Utc};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ADK_PG_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: could not start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn today(explicit: Option<NaiveDate>) -> NaiveDate {
    explicit.unwrap_or_else(|| Utc::now().date_naive())
}

fn spinner(message: &str) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message(message.to_owned());
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

async fn run(cli: Cli) -> Result<ExitCode> {
    let url = cli.database_url;
    if url.trim().is_empty() {
        anyhow::bail!("no database given: pass --database-url or set DATABASE_URL");
    }
    match cli.command {
        Command::Migrate { citus } => {
            let applied = if citus {
                adk_postgres_schema::run_pending_migrations_on_citus(&url).await
            } else {
                adk_postgres_schema::run_pending_migrations(&url).await
            }
            .context("migrate")?;
            if applied.is_empty() {
                println!("the database is up to date");
            } else {
                for version in applied {
                    println!("applied {version}");
                }
            }
            if let Some(layout) = adk_postgres_schema::citus_layout(&url).await.context("reading the Citus layout")? {
                println!(
                    "citus: {} distributed by user_id ({}), {} reference tables ({}), {} functions delegated, {} workers",
                    layout.distributed_tables.len(),
                    layout.distributed_tables.join(", "),
                    layout.reference_tables.len(),
                    layout.reference_tables.join(", "),
                    layout.delegated_functions.len(),
                    layout.workers
                );
                if !layout.schema_guarded {
                    eprintln!(
                        "citus: WARNING: the store's schema is not guarded (migrate as a superuser to install the \
                         guard); on Citus, no other role may have CREATE on it (docs/citus.md)"
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Maintain(args) => maintain(&url, args).await,
        Command::Rollup(args) => rollup(&url, args).await,
        Command::Usage(args) => usage(&url, args).await,
        Command::Policy { command } => policy(&url, command).await,
        Command::Archive { command } => archive(&url, command).await,
        Command::Expire { batch_size, json } => {
            let bar = spinner("expiring sessions");
            let report = expire_sessions(&url, batch_size, None).await.context("expire sessions");
            bar.finish_and_clear();
            let report = report?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!("{report}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::ConvertEvents { dry_run, cutover, lock_timeout } => {
            let cutover = today(cutover);
            if dry_run {
                let plan = conversion_plan(&url, cutover).await.context("plan the conversion")?;
                print!("{plan}");
                return Ok(ExitCode::SUCCESS);
            }
            let policy = LockPolicy { lock_timeout: lock_timeout.into(), ..LockPolicy::default() };
            let bar = ProgressBar::new(12);
            bar.set_style(
                ProgressStyle::with_template("[{bar:30}] step {pos}/{len} {msg} ({elapsed})")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            let report = convert_events(&url, cutover, &policy, &mut |event| match event {
                ConvertProgress::StepStarted { number, title, .. } => {
                    bar.set_position(number.saturating_sub(1) as u64);
                    bar.set_message(title.to_owned());
                }
                ConvertProgress::IndexBuild { index, phase, blocks_done, blocks_total, .. } => {
                    let percent = if blocks_total > 0 { blocks_done * 100 / blocks_total } else { 0 };
                    bar.set_message(format!("{index}: {phase} {percent}%"));
                }
                ConvertProgress::Validating { statement, elapsed_ms, .. } => {
                    bar.set_message(format!("validating ({}s): {statement}", elapsed_ms / 1000));
                }
                ConvertProgress::DroppedInvalidIndex { index, .. } => {
                    bar.println(format!("dropped {index}, left invalid by an interrupted build"));
                }
                ConvertProgress::StepFinished { number, .. } => bar.set_position(number as u64),
            })
            .await;
            bar.finish_and_clear();
            let report = report.context("convert adk_events")?;
            println!("{report}");
            Ok(ExitCode::SUCCESS)
        }
        Command::CreateIndex { name, columns, lock_timeout } => {
            let policy = LockPolicy { lock_timeout: lock_timeout.into(), ..LockPolicy::default() };
            let columns: Vec<&str> = columns.iter().map(String::as_str).collect();
            let bar = ProgressBar::new(0);
            bar.set_style(
                ProgressStyle::with_template("[{bar:30}] {pos}/{len} partitions {msg} ({elapsed})")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            let report = create_partitioned_index(&url, &name, &columns, &policy, &mut |event| match event {
                IndexProgress::Started { partitions, .. } => bar.set_length(partitions as u64),
                IndexProgress::Building { partition, progress, .. } => {
                    bar.set_message(format!("{partition}: {}", progress.phase));
                }
                IndexProgress::Attached { .. } | IndexProgress::PartitionSkipped { .. } => bar.inc(1),
                _ => {}
            })
            .await;
            bar.finish_and_clear();
            let report = report.context("create the index")?;
            println!("{report}");
            Ok(ExitCode::SUCCESS)
        }
        Command::ServiceRole { role, create, password_env, apps, all_apps, show, json } => {
            if show {
                let view = show_service_role(&url, &role).await.context("read the service role")?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&view)?);
                } else {
                    println!("{}", render::service_role(&view));
                }
                return Ok(ExitCode::SUCCESS);
            }
            let password = match password_env {
                Some(var) => Some(std::env::var(&var).with_context(|| format!("read the password from ${var}"))?),
                None => None,
            };
            let apps = match (all_apps, apps.is_empty()) {
                (true, _) => AppBinding::AllApps,
                (false, false) => AppBinding::Apps(apps),
                (false, true) => AppBinding::Keep,
            };
            let report = setup_service_role(&url, &role, &ServiceRoleOptions { create, password, apps })
                .await
                .context("set up the service role")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!("{report}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { json, thresholds, today: day } => {
            let report = health(&url, today(day), &health_thresholds(&thresholds)).await.context("read health")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!("{report}");
                for alert in &report.alerts {
                    println!("ALERT: {alert}");
                }
            }
            Ok(if report.is_healthy() { ExitCode::SUCCESS } else { ExitCode::from(2) })
        }
        Command::Serve(args) => serve(&url, args).await,
        Command::EraseUser(args) => erase_user(&url, args).await,
        Command::Sessions(args) => sessions::list(&url, args).await,
        Command::ChangeFeed { switch } => change_feed(&url, switch).await,
    }
}

/// `adk-pg change-feed on|off|status`, as the tables' owner.
async fn change_feed(url: &str, switch: FeedSwitch) -> Result<ExitCode> {
    let pool = PoolConfig { max_size: 1, application_name: "adk-pg change-feed".into(), ..PoolConfig::default() };
    let store = PgSessionStore::connect(url, &pool, Default::default()).await.context("connect")?;
    let enabled = match switch {
        FeedSwitch::Status => store.change_feed_enabled().await.context("read the change feed's state")?,
        FeedSwitch::On | FeedSwitch::Off => {
            let on = switch == FeedSwitch::On;
            let changed = store.set_change_feed(on).await.context("switch the change feed")?;
            if !changed {
                println!("the change feed was already {}", if on { "on" } else { "off" });
            }
            on
        }
    };
    println!("change feed: {}", if enabled { "on" } else { "off" });
    Ok(ExitCode::SUCCESS)
}

/// `adk-pg erase-user`: counts first (the size of the job, and whether an
/// interrupted erasure is resumed), then erases in batches with progress
/// lines on stderr and the report on stdout. The user id itself is never
/// printed: the lines name the user by the hash the audit record keeps.
async fn erase_user(url: &str, args: EraseUserArgs) -> Result<ExitCode> {
    let app = adk_postgres_domain::AppName::new(args.app.as_str())?;
    let user = adk_postgres_domain::UserId::new(args.user.as_str())?;
    let options = EraseOptions { batch_size: args.batch_size, dry_run: args.dry_run };
    // One batch at a time: two connections are plenty.
    let pool = PoolConfig { max_size: 2, application_name: "adk-pg erase-user".into(), ..PoolConfig::default() };
    // Per request: the owner acts for any app, a service role only for
    // the apps it is bound to.
    let store = PgSessionStore::connect(url, &pool, Default::default())
        .await
        .context("connect")?
        .with_tenant_scope(TenantScope::PerRequest);
    let preview = store
        .erase_user_with(&app, &user, EraseOptions { dry_run: true, ..options }, |_| {})
        .await
        .context("count what the erasure would delete")?;
    if args.dry_run {
        if args.json {
            println!("{}", serde_json::to_string_pretty(&preview)?);
        } else {
            println!("{preview}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "{} user {} of app {}: {} session(s), {} event(s), {} usage tail(s), {}; batches of {}",
        match preview.erasure_id {
            Some(id) => format!("resuming interrupted erasure #{id} of"),
            None => "erasing".to_owned(),
        },
        preview.user_hash.get(..12).unwrap_or(&preview.user_hash),
        preview.app_name,
        preview.sessions,
        preview.events,
        preview.usage_tails,
        if preview.user_state { "the user state" } else { "no user state" },
        options.batch_size,
    );
    // Every step but event batches is printed; event batches at most once a
    // second, so a large user gives a readable log.
    let mut printed = std::time::Instant::now();
    let show = |progress: &EraseProgress| {
        let routine = progress.step == EraseStep::Events;
        if !routine || printed.elapsed() >= std::time::Duration::from_secs(1) {
            eprintln!("{progress}");
            printed = std::time::Instant::now();
        }
    };
    let report = store.erase_user_with(&app, &user, options, show).await.context(
        "erase the user (the erasure is recorded as running and its sessions are already hidden: \
         run the same command again to finish it)",
    )?;
    let archive = erase_from_archive(url, app.as_str(), user.as_str(), report.erasure_id).await?;
    if args.json {
        let mut value = serde_json::to_value(&report)?;
        if let Some(map) = value.as_object_mut() {
            map.insert("archive".into(), serde_json::to_value(&archive)?);
        }
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        println!("{report}");
        if let Some(archive) = &archive {
            println!(
                "archive: {} archived row(s) and {} restored row(s) removed; {} object(s) rewritten, \
                 {} ruled out by their footer, {} read",
                archive.archived_rows_removed,
                archive.restored_rows_removed,
                archive.rewritten,
                archive.skipped_by_footer,
                archive.read
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The archive's part of an erasure: `None` when nothing of the app was
/// ever archived or restored. A role that may not rewrite the archive
/// fails here, after the live log was erased, saying so.
async fn erase_from_archive(
    url: &str,
    app: &str,
    user: &str,
    erasure_id: Option<i64>,
) -> Result<Option<adk_postgres_archive::ArchiveErasure>> {
    let mut conn = connect(url, "adk-pg erase-user", &LockPolicy::default()).await.context("connect")?;
    let objects = adk_postgres_archive::list_archive(&mut conn, Some(app), Some(app))
        .await
        .context("read the archive catalog")?;
    if objects.is_empty() && !adk_postgres_archive::has_restored_copies(&mut conn, app).await.unwrap_or(false) {
        return Ok(None);
    }
    let erased =
        adk_postgres_archive::erase_user(&mut conn, app, user, erasure_id, &StoreOptions::default()).await.context(
            "erase the user from the archive (the live log is erased; run the same command again, as the \
             store's owner, to reach the archive)",
        )?;
    Ok(Some(erased))
}

fn health_thresholds(args: &ThresholdArgs) -> HealthThresholds {
    HealthThresholds {
        min_partitions_ahead: args.min_partitions_ahead,
        max_run_age: args.max_run_age.into(),
        max_rollup_lag: args.max_rollup_lag.into(),
        max_late_rejected_today: args.max_late_rejected,
    }
}

async fn serve(url: &str, args: ServeArgs) -> Result<ExitCode> {
    // From the environment only: a flag's value shows in `ps` and in shell
    // history.
    let token = match std::env::var(TOKEN_VAR) {
        Ok(token) => Some(token),
        Err(std::env::VarError::NotPresent) => None,
        Err(e) => anyhow::bail!("read {TOKEN_VAR}: {e}"),
    };
    let config = ServeConfig {
        listen: args.listen,
        token,
        statement_timeout: args.statement_timeout.into(),
        thresholds: health_thresholds(&args.thresholds),
        ..ServeConfig::new(url)
    };
    let server = Server::bind(config).await.context("start adk-pg serve")?;
    let address = server.local_addr()?;
    eprintln!("adk-pg serve: listening on http://{address}/ (metrics at /metrics, readiness at /readyz)");
    server.serve(stop_signal()).await.context("serve")?;
    Ok(ExitCode::SUCCESS)
}

/// Ctrl-C, or the SIGTERM a service manager or container runtime sends.
async fn stop_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            // Without a SIGTERM handler, Ctrl-C still stops the server.
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

async fn maintain(url: &str, args: MaintainArgs) -> Result<ExitCode> {
    let config = MaintenanceConfig {
        session_delete_batch: args.session_delete_batch,
        lock_policy: LockPolicy { lock_timeout: args.lock_timeout.into(), ..LockPolicy::default() },
        ..MaintenanceConfig::default()
    };
    let mut stop = std::pin::pin!(tokio::signal::ctrl_c());
    loop {
        let bar = spinner("maintaining partitions");
        let outcome = run_maintenance(url, today(args.today), &config).await;
        bar.finish_and_clear();
        match outcome {
            Ok(report) if args.json => println!("{}", serde_json::to_string(&report)?),
            Ok(report) => println!("{report}"),
            // One failed run must not stop a long-running maintainer: the
            // next tick retries, and `status` alerts if runs keep failing.
            Err(e) if args.every.is_some() => eprintln!("error: maintenance failed: {e}"),
            Err(e) => return Err(e).context("maintenance"),
        }
        let Some(every) = args.every else { return Ok(ExitCode::SUCCESS) };
        if !wait_for_next_run(every.into(), stop.as_mut()).await {
            return Ok(ExitCode::SUCCESS);
        }
    }
}

async fn rollup(url: &str, args: RollupArgs) -> Result<ExitCode> {
    let config =
        RollupConfig { author_cap: args.author_cap, writer_wait: args.writer_wait.into(), ..RollupConfig::default() };
    let mut stop = std::pin::pin!(tokio::signal::ctrl_c());
    loop {
        let bar = spinner("rolling up usage");
        let outcome = run_rollup(url, &config).await;
        bar.finish_and_clear();
        match outcome {
            Ok(report) => {
                if args.json {
                    println!("{}", serde_json::to_string(&report)?);
                } else {
                    println!("{report}");
                }
                // Once: a run that could not advance needs attention, as
                // `status` would say. In a loop the next tick tries again.
                if args.every.is_none() && !report.waiting_on.is_empty() {
                    return Ok(ExitCode::from(2));
                }
            }
            // One failed run must not stop a long-running roller: the next
            // tick retries from the same watermark, and `status` alerts on
            // the failed run and the growing lag.
            Err(e) if args.every.is_some() => eprintln!("error: rollup failed: {e}"),
            Err(e) => return Err(e).context("rollup"),
        }
        let Some(every) = args.every else { return Ok(ExitCode::SUCCESS) };
        if !wait_for_next_run(every.into(), stop.as_mut()).await {
            return Ok(ExitCode::SUCCESS);
        }
    }
}

async fn usage(url: &str, args: UsageArgs) -> Result<ExitCode> {
    let now = Utc::now();
    let since = time_arg("--since", &args.since, now).map_err(anyhow::Error::msg)?;
    let until = match &args.until {
        Some(until) => time_arg("--until", until, now).map_err(anyhow::Error::msg)?,
        None => now,
    };
    // The library's own refusals name the field and say what to change;
    // they are printed as they are.
    let by = args.by.as_deref().map(str::parse::<GroupBy>).transpose()?;
    let resolution: Resolution = args.resolution.parse()?;
    let query = UsageQuery { app: args.app, window: Some((since, until)), by, resolution };
    let report = usage_at(url, &query).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{report}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Sleeps until the next run of a `--every` loop; false when Ctrl-C came
/// first. `stop` is one future for the whole loop: once first polled it
/// owns SIGINT, so a Ctrl-C during a run is kept and ends the loop when
/// that run is done (a fresh `ctrl_c()` per sleep would miss it). Before
/// the first sleep Ctrl-C ends the process at once, which is as safe: every
/// run survives being interrupted at any point.
async fn wait_for_next_run(
    every: std::time::Duration,
    stop: Pin<&mut impl Future<Output = std::io::Result<()>>>,
) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(every) => true,
        _ = stop => false,
    }
}

async fn policy(url: &str, command: PolicyCommand) -> Result<ExitCode> {
    let mut conn = connect(url, "adk-pg policy", &LockPolicy::default()).await.context("connect")?;
    // Also tells an unmigrated database apart from a failed read.
    store_policy(&mut conn).await.context("read the store policy")?;
    match command {
        PolicyCommand::Show { json } => {
            let current = policy_settings(&mut conn).await.context("read the store policy")?;
            let archive = read_archive_policy(&mut conn).await.context("read the archive policy")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&render::policy_json(&current, &archive))?);
            } else {
                println!("{}", render::policy_table(&current));
                println!("{archive}");
            }
        }
        PolicyCommand::Set(args) => {
            let json = args.json;
            let archive = archive_setting(args.archive.as_deref(), &args.archive_apps)?;
            let amendment = amendment(args);
            if amendment.is_empty() && archive.is_none() {
                anyhow::bail!(
                    "nothing to change: pass --max-session-lifetime, --retention, --default-ttl, --premake-days, \
                     --usage-lateness, --usage-minute-retention, --usage-hour-retention, --usage-day-retention \
                     or --archive"
                );
            }
            // Refuses a database without the usage columns by name, before
            // the amendment's statement would fail on them.
            let mut updated = policy_settings(&mut conn).await.context("read the store policy")?;
            if !amendment.is_empty() {
                updated = amend_policy_settings(&mut conn, &amendment).await.context("set the store policy")?;
            }
            let archive = match archive {
                Some(setting) => set_archive_policy(&mut conn, &setting).await.context("set the archive policy")?,
                None => read_archive_policy(&mut conn).await.context("read the archive policy")?,
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&render::policy_json(&updated, &archive))?);
            } else {
                println!("policy updated");
                println!("{}", render::policy_table(&updated));
                println!("{archive}");
            }
        }
        PolicyCommand::History { limit, json } => {
            let changes = policy_changes(&mut conn, limit).await.context("read the policy history")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&render::policy_changes_json(&changes))?);
            } else if changes.is_empty() {
                println!("the policy has not been changed since it was installed");
            } else {
                println!("{}", render::policy_history_table(&changes));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--archive URL|off` with `--archive-apps a,b|all`.
fn archive_setting(archive: Option<&str>, apps: &[String]) -> Result<Option<ArchiveSetting>> {
    let Some(archive) = archive else { return Ok(None) };
    if archive.eq_ignore_ascii_case("off") {
        if !apps.is_empty() {
            anyhow::bail!("--archive-apps goes with --archive URL, not with --archive off");
        }
        return Ok(Some(ArchiveSetting::Off));
    }
    let apps = match apps {
        [] => None,
        [all] if all.eq_ignore_ascii_case("all") => None,
        apps => Some(apps.iter().map(|app| app.trim().to_owned()).collect()),
    };
    Ok(Some(ArchiveSetting::On { url: archive.to_owned(), apps }))
}

/// `adk-pg archive list|verify|restore`. Object store credentials come
/// from the environment (AWS_*), as maintenance reads them.
async fn archive(url: &str, command: ArchiveCommand) -> Result<ExitCode> {
    let mut conn = connect(url, "adk-pg archive", &LockPolicy::default()).await.context("connect")?;
    let options = StoreOptions::default();
    match command {
        ArchiveCommand::List { app, json } => {
            let objects = adk_postgres_archive::list_archive(&mut conn, app.as_deref(), app.as_deref())
                .await
                .context("list the archive")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&objects)?);
            } else if objects.is_empty() {
                println!("nothing archived{}", app.map(|a| format!(" for app {a}")).unwrap_or_default());
            } else {
                println!("{}", render::archive_table(&objects));
            }
            Ok(ExitCode::SUCCESS)
        }
        ArchiveCommand::Verify { app, json } => {
            let checks = adk_postgres_archive::verify_archive(&mut conn, app.as_deref(), app.as_deref(), &options)
                .await
                .context("verify the archive")?;
            let bad = checks.iter().filter(|check| check.problem.is_some()).count();
            if json {
                println!("{}", serde_json::to_string_pretty(&checks)?);
            } else {
                for check in &checks {
                    if let Some(problem) = &check.problem {
                        println!("BAD {}: {problem}", check.object.object_key);
                    }
                }
                println!("{} object(s) checked, {} verified, {bad} did not", checks.len(), checks.len() - bad);
            }
            Ok(if bad == 0 { ExitCode::SUCCESS } else { ExitCode::from(2) })
        }
        ArchiveCommand::Restore { app, day, schema, json } => {
            let report = adk_postgres_archive::restore_day(&mut conn, &app, day, &schema, &options)
                .await
                .context("restore the archived day")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!(
                    "restored app {} on {} into {}: {} event(s), {} piece(s) of media, from {} object(s), \
                     checked against the catalog; read-only",
                    report.app_name, report.day, report.schema, report.events, report.media, report.objects
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn amendment(args: PolicySetArgs) -> PolicyAmendment {
    PolicyAmendment {
        max_session_lifetime: args.max_session_lifetime.map(Into::into),
        retention: args.retention.map(Into::into),
        default_ttl: args.default_ttl.map(|ttl| ttl.0),
        premake_days: args.premake_days,
        usage_lateness: args.usage_lateness.map(Into::into),
        usage_minute_retention: args.usage_minute_retention.map(Into::into),
        usage_hour_retention: args.usage_hour_retention.map(Into::into),
        usage_day_retention: args.usage_day_retention.map(|kept| kept.0),
    }
}
