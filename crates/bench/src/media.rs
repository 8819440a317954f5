//! Media: a session of 16 events each carrying a distinct 1 MB image, sent
//! through the adk trait as a multimodal agent sends them
//! (`Part::InlineData`, which adk-rust serializes as an array of numbers),
//! on our store (media apart from the log, the default), on our store with
//! media kept inline, and on adk-session's `PostgresSessionService`.
//!
//! Three scenarios, each on fresh databases of its own so that relation
//! sizes are the scenario's alone:
//!
//! - 16 x 1 MB: inline, an event is about 3.6 MB of JSON, over our 1 MiB
//!   event limit, so our inline leg shows the refusals; adk-session stores
//!   it as it comes.
//! - 16 x 200 kB: small enough to be stored inline by us too (~720 kB
//!   events), so media apart is compared with media inline on one store.
//! - Dedup: 100 users of one app each send the same 1 MB image once.
//!
//! Images are pseudo-random bytes: incompressible, as real images are.
//! Every leg of a scenario runs round by round, interleaved, so a slow
//! spell on the shared machine falls on all of them; timings are medians
//! and the figures compared are ratios within the run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use adk_core::identity::{AdkIdentity, AppName, SessionId, UserId};
use adk_core::{Content, Part};
use adk_postgres_adk::PgSessionService;
use adk_postgres_domain::StoreConfig;
use adk_postgres_storage::{PgSessionStore, TenantScope};
use adk_postgres_testing::media_bytes;
use adk_session::{AppendEventRequest, CreateRequest, Event, GetRequest, SessionService};
use anyhow::{Context as _, anyhow, bail, ensure};
use chrono::NaiveDate;
use serde::Serialize;
use tokio_postgres::Client;

use crate::driver::pool_config;
use crate::measure::{Latency, Sample};
use crate::run::{bound_service_url, migrate_ours};
use crate::server::{Server, connect, human_bytes};
use crate::workload::{APP, initial_state};

/// Images per session, and their sizes: the session, and one whose
/// events our store can still keep inline.
pub const IMAGES: usize = 16;
pub const LARGE_IMAGE_BYTES: usize = 1_000_000;
pub const SMALL_IMAGE_BYTES: usize = 200_000;
/// Users of the app sending the same image in the dedup scenario.
pub const DEDUP_SESSIONS: usize = 100;

/// The code our adapter gives an event over the limit.
const EVENT_TOO_LARGE: &str = "session.event_too_large";

/// Repetitions of one run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MediaPlan {
    /// Sessions of `IMAGES` events appended per leg and scenario.
    pub rounds: usize,
    /// Whole-session gets per leg and round.
    pub gets: usize,
    /// Sessions of the dedup scenario on adk-session (ours: `DEDUP_SESSIONS`).
    pub peer_dedup_sessions: usize,
}

/// How a leg stores media.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Leg {
    /// Our store as configured by default: media of 64 KiB or more apart.
    Ours,
    /// Our store with `media_offload_bytes: Some(usize::MAX)`: media inline.
    OursInline,
    /// adk-session 2.3's `PostgresSessionService`.
    AdkSession,
}

impl Leg {
    pub fn label(self) -> &'static str {
        match self {
            Leg::Ours => "ours (media apart)",
            Leg::OursInline => "ours (media inline)",
            Leg::AdkSession => "adk-session",
        }
    }

    fn database(self) -> &'static str {
        match self {
            Leg::Ours => "adk_bench_media_ours",
            Leg::OursInline => "adk_bench_media_inline",
            Leg::AdkSession => "adk_bench_media_adk_session",
        }
    }
}

/// What one leg of a session scenario measured, per session.
#[derive(Debug, Clone, Serialize)]
pub struct LegFigures {
    pub leg: Leg,
    pub implementation: &'static str,
    /// Sessions appended to (one per round).
    pub sessions: usize,
    /// One event as adk serializes it (`serde_json`), what an inline store
    /// is sent.
    pub event_json_bytes: usize,
    /// Appends refused (our inline leg over the 1 MiB event limit), and the
    /// first refusal's message.
    pub refused: usize,
    pub refusal: Option<String>,
    /// Per accepted event; `None` when every append was refused.
    pub append: Option<Latency>,
    /// Whole-session gets through the adk trait (into adk `Event`s).
    pub get: Option<Latency>,
    /// Events stored per session.
    pub events_per_session: f64,
    /// The log: stored size (`pg_column_size`, after any compression) of
    /// the events' JSON columns, per session.
    pub log_bytes_per_session: f64,
    /// Stored size of the blobs' bytes (`adk_blobs.data`), per session.
    pub blob_bytes_per_session: f64,
    /// `pg_total_relation_size` of the event tables (every partition) and
    /// of `adk_blobs`, with TOAST and indexes, per session.
    pub on_disk_bytes_per_session: f64,
    /// Peak resident memory of the bench process during the leg's gets, over
    /// what it held before them (`VmHWM` reset first; `None` where Linux
    /// does not allow the reset). A lower bound of what the gets need:
    /// memory an earlier leg freed and the allocator kept is reused without
    /// showing, so a leg run after a hungrier one can read near zero.
    pub get_peak_rss_growth_bytes: Option<u64>,
    /// Against the scenario's baseline leg of the same run.
    pub vs_baseline: Option<VsBaseline>,
}

/// A leg's figures over the baseline's (lower is better for every one).
#[derive(Debug, Clone, Serialize)]
pub struct VsBaseline {
    pub baseline: &'static str,
    pub append_p50: Option<f64>,
    pub get_p50: Option<f64>,
    pub log_bytes: Option<f64>,
    pub on_disk_bytes: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SessionScenario {
    pub images: usize,
    pub image_bytes: usize,
    pub legs: Vec<LegFigures>,
}

/// The same image sent once by each of `sessions` users of one app.
#[derive(Debug, Clone, Serialize)]
pub struct DedupLeg {
    pub leg: Leg,
    pub implementation: &'static str,
    pub sessions: usize,
    pub append: Latency,
    pub events: i64,
    pub log_bytes: i64,
    /// Rows of `adk_blobs`, the bytes they hold (`size`) and their
    /// reference counts (0 for adk-session, which has none).
    pub blob_rows: i64,
    pub blob_bytes: i64,
    pub blob_refs: i64,
    pub on_disk_bytes: i64,
    /// `on_disk_bytes` scaled linearly to `DEDUP_SESSIONS` sessions, where
    /// fewer were measured (every session's event holds its own copy).
    pub on_disk_bytes_for_dedup_sessions: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct DedupScenario {
    pub image_bytes: usize,
    pub legs: Vec<DedupLeg>,
    /// Our on-disk bytes over adk-session's, both for `DEDUP_SESSIONS`.
    pub on_disk_vs_adk_session: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MediaReport {
    pub plan: MediaPlan,
    /// 16 x 1 MB: ours (apart) and adk-session; ours inline is refused.
    pub large: SessionScenario,
    /// 16 x 200 kB: ours apart against ours inline, and adk-session.
    pub small: SessionScenario,
    pub dedup: DedupScenario,
    pub elapsed_secs: f64,
}

fn image_event(picture: Vec<u8>) -> Event {
    // One invocation for all of a session's images: a user's message that
    // opens a new invocation while the last one awaits its answer is refused
    // as busy by the invocation lease, and no agent answers here.
    let mut event = Event::new("inv-media");
    event.author = "user".into();
    let mut content = Content::new("user").with_text("what is in this picture?");
    content.parts.push(Part::InlineData { mime_type: "image/png".into(), data: picture, uri: None, annotations: None });
    event.llm_response.content = Some(content);
    event
}

/// The image an event read back carries.
fn image_of(event: &Event) -> Option<&[u8]> {
    event.llm_response.content.as_ref()?.parts.iter().find_map(|part| match part {
        Part::InlineData { data, .. } => Some(data.as_slice()),
        _ => None,
    })
}

/// One leg's service and the owner's connection to its database.
struct Target {
    leg: Leg,
    service: Arc<dyn SessionService>,
    sql: Client,
}

impl Target {
    /// A fresh database for `leg`, prefixed by `scenario`; ours as the bound
    /// service role acting per request, as the rest of the bench runs it.
    async fn open(server: &Server, scenario: &str, leg: Leg, today: NaiveDate) -> anyhow::Result<Self> {
        let name = format!("{}_{scenario}", leg.database());
        let url = server.fresh_database(&name).await?;
        let service: Arc<dyn SessionService> = match leg {
            Leg::Ours | Leg::OursInline => {
                migrate_ours(&url, today).await?;
                let config = StoreConfig {
                    media_offload_bytes: (leg == Leg::OursInline).then_some(usize::MAX),
                    ..StoreConfig::default()
                };
                let store = PgSessionStore::connect(&bound_service_url(&url).await?, &pool_config(), config)
                    .await
                    .context("connecting our store")?
                    .with_tenant_scope(TenantScope::PerRequest);
                Arc::new(PgSessionService::from_store(store))
            }
            Leg::AdkSession => {
                let service = adk_session::PostgresSessionService::new(&url).await.map_err(|e| anyhow!("{e}"))?;
                service.migrate().await.map_err(|e| anyhow!("adk-session migrate: {e}"))?;
                Arc::new(service)
            }
        };
        Ok(Self { leg, service, sql: connect(&url).await? })
    }

    async fn create(&self, user: &str, session: &str) -> anyhow::Result<()> {
        self.service
            .create(CreateRequest {
                app_name: APP.to_owned(),
                user_id: user.to_owned(),
                session_id: Some(session.to_owned()),
                state: initial_state(),
            })
            .await
            .map_err(|e| anyhow!("create {user}/{session} on {}: {e}", self.leg.label()))?;
        Ok(())
    }

    /// Appends `event`: its time, or the refusal of an event over the limit.
    async fn append(&self, user: &str, session: &str, event: Event) -> anyhow::Result<Result<Duration, String>> {
        let identity = AdkIdentity {
            app_name: AppName::try_from(APP)?,
            user_id: UserId::try_from(user)?,
            session_id: SessionId::try_from(session)?,
        };
        let began = Instant::now();
        match self.service.append_event_for_identity(AppendEventRequest { identity, event }).await {
            Ok(_) => Ok(Ok(began.elapsed())),
            Err(error) if error.code == EVENT_TOO_LARGE => Ok(Err(error.to_string())),
            Err(error) => bail!("append to {user}/{session} on {}: {error}", self.leg.label()),
        }
    }

    async fn get(&self, user: &str, session: &str) -> anyhow::Result<(Duration, Vec<Event>)> {
        let began = Instant::now();
        let loaded = self
            .service
            .get(GetRequest {
                app_name: APP.to_owned(),
                user_id: user.to_owned(),
                session_id: session.to_owned(),
                num_recent_events: None,
                after: None,
            })
            .await
            .map_err(|e| anyhow!("get {user}/{session} on {}: {e}", self.leg.label()))?;
        let took = began.elapsed();
        let events = loaded.events();
        Ok((took, (0..events.len()).filter_map(|i| events.at(i).cloned()).collect()))
    }

    /// (events, log bytes, blob rows, blob bytes, blob refs, on-disk bytes).
    async fn sizes(&self) -> anyhow::Result<Sizes> {
        let row = match self.leg {
            Leg::Ours | Leg::OursInline => {
                self.sql
                    .query_one(
                        "SELECT (SELECT count(*) FROM adk_events),
                                (SELECT coalesce(sum(pg_column_size(payload)), 0)::bigint FROM adk_events),
                                (SELECT count(*) FROM adk_blobs),
                                (SELECT coalesce(sum(size), 0)::bigint FROM adk_blobs),
                                (SELECT coalesce(sum(pg_column_size(data)), 0)::bigint FROM adk_blobs),
                                (SELECT coalesce(sum(refs), 0)::bigint FROM adk_blobs),
                                (SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint
                                   FROM pg_partition_tree('adk_events'))
                                  + pg_total_relation_size('adk_blobs')",
                        &[],
                    )
                    .await?
            }
            Leg::AdkSession => {
                self.sql
                    .query_one(
                        "SELECT count(*),
                                coalesce(sum(pg_column_size(llm_response) + pg_column_size(actions)
                                             + pg_column_size(long_running_tool_ids)), 0)::bigint,
                                0::bigint, 0::bigint, 0::bigint, 0::bigint,
                                pg_total_relation_size('events')
                           FROM events",
                        &[],
                    )
                    .await?
            }
        };
        Ok(Sizes {
            events: row.get(0),
            log_bytes: row.get(1),
            blob_rows: row.get(2),
            blob_bytes: row.get(3),
            blob_stored_bytes: row.get(4),
            blob_refs: row.get(5),
            on_disk_bytes: row.get(6),
        })
    }
}

#[derive(Debug, Clone, Copy)]
struct Sizes {
    events: i64,
    log_bytes: i64,
    blob_rows: i64,
    blob_bytes: i64,
    blob_stored_bytes: i64,
    blob_refs: i64,
    on_disk_bytes: i64,
}

/// Resets the process's peak resident set (`VmHWM`), so a later reading is
/// the peak since now; false where the kernel refuses.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn status_kb(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = status.lines().find_map(|l| l.strip_prefix(field))?.split_whitespace().next()?.parse::<u64>().ok()?;
    Some(kb * 1024)
}

/// What a leg gathers over the rounds.
struct Tally {
    appends: Sample,
    gets: Sample,
    refused: usize,
    refusal: Option<String>,
    event_json_bytes: usize,
    rss_growth: Option<u64>,
}

impl Tally {
    fn new() -> Self {
        Self {
            appends: Sample::default(),
            gets: Sample::default(),
            refused: 0,
            refusal: None,
            event_json_bytes: 0,
            rss_growth: Some(0),
        }
    }
}

/// A session of `IMAGES` events with images of `image_bytes` on each of
/// `legs` (the first is the baseline), `plan.rounds` sessions per leg.
async fn session_scenario(
    server: &Server,
    today: NaiveDate,
    name: &str,
    image_bytes: usize,
    legs: &[Leg],
    plan: MediaPlan,
) -> anyhow::Result<SessionScenario> {
    let mut targets = Vec::new();
    for &leg in legs {
        targets.push(Target::open(server, name, leg, today).await?);
    }
    let mut tallies: Vec<Tally> = legs.iter().map(|_| Tally::new()).collect();
    for round in 0..plan.rounds {
        crate::run::log(format!(
            "media: {IMAGES} x {} images in one session, round {}/{}",
            human_bytes(image_bytes as f64),
            round + 1,
            plan.rounds
        ));
        let (user, session) = (format!("media-u-{round}"), format!("media-{round}"));
        // Each round its own images, so no leg deduplicates across rounds.
        let images: Vec<Vec<u8>> =
            (0..IMAGES).map(|n| media_bytes(image_bytes, (round * IMAGES + n) as u64 + 1)).collect();
        for (target, tally) in targets.iter().zip(tallies.iter_mut()) {
            target.create(&user, &session).await?;
            let mut sample = Sample::default();
            let mut elapsed = Duration::ZERO;
            let mut accepted = 0;
            for picture in &images {
                let event = image_event(picture.clone());
                tally.event_json_bytes = tally.event_json_bytes.max(serde_json::to_vec(&event)?.len());
                match target.append(&user, &session, event).await? {
                    Ok(took) => {
                        sample.record(took);
                        elapsed += took;
                        accepted += 1;
                    }
                    Err(refusal) => {
                        tally.refused += 1;
                        tally.refusal.get_or_insert(refusal);
                    }
                }
            }
            if accepted > 0 {
                sample.end_round(accepted, elapsed);
                tally.appends.merge(&sample);
            }
        }
        for (target, tally) in targets.iter().zip(tallies.iter_mut()) {
            if tally.refused == IMAGES * (round + 1) {
                continue;
            }
            // The first read checks what came back and warms the caches;
            // the timed ones follow.
            let (_, events) = target.get(&user, &session).await?;
            ensure!(events.len() == IMAGES, "{} read {} events of {IMAGES}", target.leg.label(), events.len());
            for (event, picture) in events.iter().zip(&images) {
                ensure!(
                    image_of(event) == Some(picture.as_slice()),
                    "{} read an image back changed",
                    target.leg.label()
                );
            }
            drop(events);
            let before = status_kb("VmRSS:");
            let reset = reset_peak_rss();
            let mut sample = Sample::default();
            let mut elapsed = Duration::ZERO;
            for _ in 0..plan.gets {
                let (took, events) = target.get(&user, &session).await?;
                ensure!(events.len() == IMAGES, "{} read {} events", target.leg.label(), events.len());
                sample.record(took);
                elapsed += took;
            }
            sample.end_round(plan.gets as u64, elapsed);
            tally.gets.merge(&sample);
            let growth = match (reset, before, status_kb("VmHWM:")) {
                (true, Some(before), Some(peak)) => Some(peak.saturating_sub(before)),
                _ => None,
            };
            tally.rss_growth = tally.rss_growth.zip(growth).map(|(a, b)| a.max(b));
        }
    }
    let sessions = plan.rounds as f64;
    let mut figures = Vec::new();
    for (target, tally) in targets.iter().zip(tallies) {
        let sizes = target.sizes().await?;
        let measured_gets = tally.gets.ops() > 0;
        figures.push(LegFigures {
            leg: target.leg,
            implementation: target.leg.label(),
            sessions: plan.rounds,
            event_json_bytes: tally.event_json_bytes,
            refused: tally.refused,
            refusal: tally.refusal,
            append: (tally.appends.ops() > 0).then(|| tally.appends.summary()),
            get: measured_gets.then(|| tally.gets.summary()),
            events_per_session: sizes.events as f64 / sessions,
            log_bytes_per_session: sizes.log_bytes as f64 / sessions,
            blob_bytes_per_session: sizes.blob_stored_bytes as f64 / sessions,
            on_disk_bytes_per_session: sizes.on_disk_bytes as f64 / sessions,
            get_peak_rss_growth_bytes: if measured_gets { tally.rss_growth } else { None },
            vs_baseline: None,
        });
    }
    for target in targets {
        drop(target);
    }
    for &leg in legs {
        server.drop_database(&format!("{}_{name}", leg.database())).await?;
    }
    let baseline = figures.first().cloned();
    if let Some(base) = baseline {
        for leg in figures.iter_mut().skip(1) {
            leg.vs_baseline = Some(versus(leg, &base));
        }
    }
    Ok(SessionScenario { images: IMAGES, image_bytes, legs: figures })
}

fn versus(leg: &LegFigures, base: &LegFigures) -> VsBaseline {
    let over = |a: Option<f64>, b: Option<f64>| crate::report::ratio(a?, b?);
    let p50 = |l: &Option<Latency>| l.as_ref().map(|l| l.p50_ms);
    // A leg that stored nothing (every append refused) has no size to compare.
    let stored = |x: f64| (x > 0.0 && leg.events_per_session > 0.0).then_some(x);
    VsBaseline {
        baseline: base.implementation,
        append_p50: over(p50(&leg.append), p50(&base.append)),
        get_p50: over(p50(&leg.get), p50(&base.get)),
        log_bytes: over(stored(leg.log_bytes_per_session), stored(base.log_bytes_per_session)),
        on_disk_bytes: over(stored(leg.on_disk_bytes_per_session), stored(base.on_disk_bytes_per_session)),
    }
}

/// `DEDUP_SESSIONS` users each appending one event with the same image.
async fn dedup_scenario(server: &Server, today: NaiveDate, plan: MediaPlan) -> anyhow::Result<DedupScenario> {
    const NAME: &str = "dedup";
    let legs = [Leg::Ours, Leg::AdkSession];
    let picture = media_bytes(LARGE_IMAGE_BYTES, 0xd0d0);
    let mut result = Vec::new();
    for leg in legs {
        let sessions = if leg == Leg::AdkSession { plan.peer_dedup_sessions.max(1) } else { DEDUP_SESSIONS };
        crate::run::log(format!(
            "media: {sessions} users each sending the same {} image, {}",
            human_bytes(LARGE_IMAGE_BYTES as f64),
            leg.label()
        ));
        let target = Target::open(server, NAME, leg, today).await?;
        let mut sample = Sample::default();
        let mut elapsed = Duration::ZERO;
        for i in 0..sessions {
            let (user, session) = (format!("dedup-u-{i}"), format!("dedup-{i}"));
            target.create(&user, &session).await?;
            let took = target
                .append(&user, &session, image_event(picture.clone()))
                .await?
                .map_err(|refusal| anyhow!("{} refused a 1 MB image: {refusal}", leg.label()))?;
            sample.record(took);
            elapsed += took;
        }
        sample.end_round(sessions as u64, elapsed);
        let sizes = target.sizes().await?;
        if leg == Leg::Ours {
            ensure!(
                sizes.blob_rows == 1 && sizes.blob_refs == DEDUP_SESSIONS as i64,
                "the shared image is {} blob rows with {} references",
                sizes.blob_rows,
                sizes.blob_refs
            );
        }
        result.push(DedupLeg {
            leg,
            implementation: leg.label(),
            sessions,
            append: sample.summary(),
            events: sizes.events,
            log_bytes: sizes.log_bytes,
            blob_rows: sizes.blob_rows,
            blob_bytes: sizes.blob_bytes,
            blob_refs: sizes.blob_refs,
            on_disk_bytes: sizes.on_disk_bytes,
            on_disk_bytes_for_dedup_sessions: sizes.on_disk_bytes as f64 * DEDUP_SESSIONS as f64 / sessions as f64,
        });
        drop(target);
        server.drop_database(&format!("{}_{NAME}", leg.database())).await?;
    }
    let on_disk_vs_adk_session =
        crate::report::ratio(result[0].on_disk_bytes_for_dedup_sessions, result[1].on_disk_bytes_for_dedup_sessions);
    Ok(DedupScenario { image_bytes: LARGE_IMAGE_BYTES, legs: result, on_disk_vs_adk_session })
}

/// Runs the three scenarios on `server`, each on databases of its own.
pub async fn measure(server: &Server, today: NaiveDate, plan: MediaPlan) -> anyhow::Result<MediaReport> {
    let began = Instant::now();
    let large = session_scenario(
        server,
        today,
        "large",
        LARGE_IMAGE_BYTES,
        &[Leg::AdkSession, Leg::Ours, Leg::OursInline],
        plan,
    )
    .await?;
    let small = session_scenario(
        server,
        today,
        "small",
        SMALL_IMAGE_BYTES,
        &[Leg::OursInline, Leg::Ours, Leg::AdkSession],
        plan,
    )
    .await?;
    let dedup = dedup_scenario(server, today, plan).await?;
    Ok(MediaReport { plan, large, small, dedup, elapsed_secs: began.elapsed().as_secs_f64() })
}

fn ms(latency: &Option<Latency>) -> String {
    latency.as_ref().map_or_else(|| "-".to_owned(), |l| format!("{:.1}", l.p50_ms))
}

/// Nothing stored is shown as such, not as the empty tables' size.
fn size(leg: &LegFigures, bytes: f64) -> String {
    if leg.events_per_session > 0.0 { human_bytes(bytes) } else { "-".to_owned() }
}

fn times(x: Option<f64>) -> String {
    x.map_or_else(|| "-".to_owned(), |x| format!("{x:.2}x"))
}

impl std::fmt::Display for SessionScenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let baseline = self.legs.first().map_or("-", |l| l.implementation);
        writeln!(
            f,
            "  {} x {} images in one session (per session; ratios against {baseline}):",
            self.images,
            human_bytes(self.image_bytes as f64)
        )?;
        writeln!(
            f,
            "    {:<22} {:>10} {:>8} {:>13} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8}",
            "implementation",
            "event JSON",
            "refused",
            "append p50 ms",
            "get p50 ms",
            "log",
            "blobs",
            "on disk",
            "get RSS+",
            "append",
            "get",
            "on disk"
        )?;
        for leg in &self.legs {
            let vs = leg.vs_baseline.as_ref();
            writeln!(
                f,
                "    {:<22} {:>10} {:>8} {:>13} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8}",
                leg.implementation,
                human_bytes(leg.event_json_bytes as f64),
                format!("{}/{}", leg.refused, self.images * leg.sessions),
                ms(&leg.append),
                ms(&leg.get),
                size(leg, leg.log_bytes_per_session),
                size(leg, leg.blob_bytes_per_session),
                size(leg, leg.on_disk_bytes_per_session),
                leg.get_peak_rss_growth_bytes.map_or_else(|| "-".to_owned(), |b| human_bytes(b as f64)),
                times(vs.and_then(|v| v.append_p50)),
                times(vs.and_then(|v| v.get_p50)),
                times(vs.and_then(|v| v.on_disk_bytes)),
            )?;
        }
        if let Some(refusal) = self.legs.iter().find_map(|l| l.refusal.as_ref()) {
            writeln!(f, "    refused: {refusal}")?;
        }
        Ok(())
    }
}

impl std::fmt::Display for MediaReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "Media through the adk trait (Part::InlineData, pseudo-random bytes; {} session(s) per leg, {} timed \
             gets each; log: stored size of the events' JSON; on disk: event tables and adk_blobs with TOAST and \
             indexes; get RSS+: growth of the bench process's peak memory over the gets, a lower bound since \
             memory an earlier leg freed is reused unseen):",
            self.plan.rounds, self.plan.gets
        )?;
        write!(f, "{}", self.large)?;
        write!(f, "{}", self.small)?;
        writeln!(
            f,
            "  dedup: users of one app each send the same {} image once:",
            human_bytes(self.dedup.image_bytes as f64)
        )?;
        for leg in &self.dedup.legs {
            let scaled = if leg.sessions == DEDUP_SESSIONS {
                String::new()
            } else {
                format!(" ({} scaled to {DEDUP_SESSIONS} sessions)", human_bytes(leg.on_disk_bytes_for_dedup_sessions))
            };
            writeln!(
                f,
                "    {:<22} {:>3} sessions, append p50 {:>7.1} ms, {} events, log {}, {} blob row(s) of {} with {} \
                 refs, on disk {}{scaled}",
                leg.implementation,
                leg.sessions,
                leg.append.p50_ms,
                leg.events,
                human_bytes(leg.log_bytes as f64),
                leg.blob_rows,
                human_bytes(leg.blob_bytes as f64),
                leg.blob_refs,
                human_bytes(leg.on_disk_bytes as f64)
            )?;
        }
        writeln!(
            f,
            "    on disk for {DEDUP_SESSIONS} sessions, ours vs adk-session: {}",
            times(self.dedup.on_disk_vs_adk_session)
        )?;
        write!(f, "  took {:.0} s", self.elapsed_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_distinct_and_of_the_size_asked() {
        let (a, b) = (media_bytes(1_000_001, 1), media_bytes(1_000_001, 2));
        assert_eq!(a.len(), 1_000_001);
        assert_ne!(a, b);
        assert_eq!(a, media_bytes(1_000_001, 1));
        let event = image_event(a.clone());
        assert_eq!(image_of(&event), Some(a.as_slice()));
        // adk writes the bytes as numbers: several characters a byte.
        assert!(serde_json::to_vec(&event).unwrap().len() > 3 * a.len());
    }
}
