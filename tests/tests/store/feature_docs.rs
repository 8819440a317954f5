//! The docs' "beyond the peers" snippets, kept honest: each ```rust block
//! of `docs/features/` stands, line for line, in one of the functions below,
//! which run it against a real PostgreSQL. A docs edit that is not made
//! here too fails `every_snippet_of_the_feature_pages_is_run_here`.

#![allow(unused_variables)]

use std::time::Duration;

use adk_postgres_domain::{AppName, Event, RedactOptions, SessionStore, StoreConfig, StoreError, UserId};
use adk_postgres_storage::{AppNotice, EraseOptions, PgSessionStore, PoolConfig};
use adk_postgres_testing::test_database;
use adk_postgres_tests::pg::{client, store};
use chrono::{TimeDelta, Utc};

/// The feature pages with snippets, and how many ```rust blocks each has:
/// a count that drops means a snippet left the page, or its fence broke.
const FEATURE_PAGES: [(&str, &str, usize); 9] = [
    ("docs/features/invocation-lease.md", include_str!("../../../docs/features/invocation-lease.md"), 1),
    ("docs/features/titles-and-labels.md", include_str!("../../../docs/features/titles-and-labels.md"), 1),
    ("docs/features/forks.md", include_str!("../../../docs/features/forks.md"), 1),
    ("docs/features/change-feed.md", include_str!("../../../docs/features/change-feed.md"), 1),
    ("docs/features/erasing-a-user.md", include_str!("../../../docs/features/erasing-a-user.md"), 1),
    ("docs/features/redacting-an-event.md", include_str!("../../../docs/features/redacting-an-event.md"), 1),
    ("docs/features/media.md", include_str!("../../../docs/features/media.md"), 1),
    ("docs/features/scoped-state.md", include_str!("../../../docs/features/scoped-state.md"), 1),
    (
        "docs/features/event-paging-and-app-listing.md",
        include_str!("../../../docs/features/event-paging-and-app-listing.md"),
        1,
    ),
];
const THIS_FILE: &str = include_str!("feature_docs.rs");

/// The ```rust blocks of a page, each as its lines without indentation.
fn snippets(page: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in page.lines() {
        match (&mut current, line.trim()) {
            (None, "```rust") => current = Some(Vec::new()),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(block), text) => block.push(text.to_owned()),
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn every_snippet_of_the_feature_pages_is_run_here() {
    let here: Vec<&str> = THIS_FILE.lines().map(str::trim).collect();
    for (path, page, expected) in FEATURE_PAGES {
        let blocks = snippets(page);
        assert_eq!(blocks.len(), expected, "{path}'s rust blocks: {blocks:#?}");
        for block in blocks {
            let found = here.windows(block.len()).any(|window| window.iter().zip(&block).all(|(a, b)| a == b));
            assert!(found, "this snippet of {path} is not run by this file:\n{}", block.join("\n"));
        }
    }
}

fn names() -> (AppName, UserId) {
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
    (AppName::new(format!("readme-{tag}")).expect("app"), UserId::new("u-42").expect("user"))
}

#[tokio::test(flavor = "multi_thread")]
async fn titles_and_labels() -> anyhow::Result<()> {
    let db = test_database().await;
    let store = store(db.url()).await;
    let (app, user) = names();
    let week_start = Utc::now() - TimeDelta::days(7);
    let next_week_start = Utc::now() + TimeDelta::days(1);

    use adk_postgres_domain::{CreateSession, ListSessions, SessionMetadata};

    let metadata = SessionMetadata::new()
        .with_display_name("Trip to Lisbon")
        .with_label("team", "travel")
        .with_label("k8s.io/tier", "gold");
    let session = store.create(CreateSession::new(app.clone(), user.clone()).with_metadata(metadata)).await?;

    // Rename or relabel later: replaces both, wholesale (labels are not merged).
    store.set_metadata(&session.key, SessionMetadata::new().with_display_name("Lisbon, day 2")).await?;

    // The user's sessions carrying every given label, last updated this week.
    let mut request = ListSessions::new(app, user).with_label("team", "travel");
    request.updated_after = Some(week_start); // inclusive
    request.updated_before = Some(next_week_start); // exclusive
    let page = store.list(&request).await?; // keyset pages, as any listing

    assert!(page.sessions.is_empty(), "the relabel dropped the team label: {page:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn forking() -> anyhow::Result<()> {
    let db = test_database().await;
    let store = store(db.url()).await;
    let (app, user) = names();
    let key = adk_postgres_tests::pg::new_session(&store, app.as_str(), user.as_str()).await;
    for _ in 0..12 {
        store.append(&key, Event::new("agent"), Default::default()).await?;
    }

    // A new session of the same app and user from the first 12 events of `key`.
    let branch = store.fork(&key, 12, Some("what-if".into())).await?;

    assert_eq!(branch.version, 12);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn redacting_an_event() -> anyhow::Result<()> {
    let db = test_database().await;
    let store = store(db.url()).await;
    let (app, user) = names();
    let key = adk_postgres_tests::pg::new_session(&store, app.as_str(), user.as_str()).await;
    let mut pasted = Event::new("user");
    pasted.content = Some(serde_json::json!({"role": "user", "parts": [{"text": "my card is 4111 1111"}]}));
    let event_id = store.append(&key, pasted, Default::default()).await?.event.id;

    // Replace the event's content, and any other text it carries, with a tombstone.
    let done = store.redact_event(&key, &event_id, "user pasted a card number", RedactOptions::default()).await?;
    assert!(done.event.is_redacted());

    let read = store.get(&key, Default::default()).await?;
    assert_eq!(read.events[0], done.event);
    assert!(!serde_json::to_string(&read.events[0])?.contains("4111"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn user_and_app_state_without_a_session() -> anyhow::Result<()> {
    let db = test_database().await;
    let store = store(db.url()).await;
    let (app, user) = names();
    let key = adk_postgres_tests::pg::new_session(&store, app.as_str(), user.as_str()).await;
    use serde_json::json;

    // Read: the scope's own keys, without the `user:` prefix; `{}` when there is none.
    let prefs = store.get_user_state(&app, &user).await?;
    // Merge: exactly an append's `user:` delta, under the same row lock; returns the state after it.
    let delta = json!({"tier": "gold", "trial": null});
    let after = store.merge_user_state(&app, &user, delta.as_object().cloned().unwrap_or_default()).await?;
    assert_eq!(after["tier"], "gold");
    let motd = json!({"motd": "maintenance at 22:00 UTC"});
    let flags = store.merge_app_state(&app, motd.as_object().cloned().unwrap_or_default()).await?;

    assert!(prefs.is_empty());
    assert_eq!(after.get("trial"), Some(&serde_json::Value::Null), "null is stored, as in an append");
    let session = store.get(&key, Default::default()).await?;
    assert_eq!(session.state["user:tier"], "gold", "every session of the user sees it, prefixed");
    assert_eq!(session.state["app:motd"], flags["motd"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn one_invocation_at_a_time() -> anyhow::Result<()> {
    let db = test_database().await;
    let store = store(db.url()).await;
    let (app, user) = names();
    let session = store.create(adk_postgres_domain::CreateSession::new(app, user)).await?;
    use adk_postgres_domain::{AppendOptions, InvocationLease};

    let idle = Duration::from_secs(120);
    let leased = |lease| AppendOptions { lease: Some(lease), ..AppendOptions::default() };
    let mut question = Event::new("user");
    question.invocation_id = "inv-1".into();
    let taken = store.append(&session.key, question, leased(InvocationLease::take(idle))).await?;
    let generation = taken.lease.map(|grant| grant.generation);

    // Another invocation meanwhile: refused, retryable, naming the holder.
    let mut other = Event::new("user");
    other.invocation_id = "inv-2".into();
    let busy = store.append(&session.key, other.clone(), leased(InvocationLease::take(idle))).await;
    assert!(matches!(busy, Err(StoreError::SessionBusy { ref holder, .. }) if holder == "inv-1"));

    // The holder's final answer, with its token, releases the lease; inv-2 proceeds.
    let mut answer = Event::new("assistant");
    answer.invocation_id = "inv-1".into();
    store.append(&session.key, answer, leased(InvocationLease { idle, generation, release: true })).await?;
    store.append(&session.key, other, leased(InvocationLease::take(idle))).await?;

    let stored = store.get(&session.key, Default::default()).await?;
    let order: Vec<&str> = stored.events.iter().map(|e| e.invocation_id.as_str()).collect();
    assert_eq!(order, ["inv-1", "inv-1", "inv-2"], "inv-2 waited for inv-1's turn");
    assert!(busy.is_err_and(|e| e.is_retryable()));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn media_out_of_the_log() -> anyhow::Result<()> {
    let db = test_database().await;
    let database_url = db.url().to_owned();
    let (app, user) = names();
    let png_bytes = adk_postgres_tests::conformance::media_bytes(300_000, 7);
    let key = adk_postgres_tests::pg::new_session(&store(db.url()).await, app.as_str(), user.as_str()).await;

    let config = StoreConfig { media_offload_bytes: Some(256 * 1024), ..StoreConfig::default() };
    let store = PgSessionStore::connect(&database_url, &PoolConfig::default(), config).await?;

    let mut event = Event::new("user");
    event.content = Some(serde_json::json!({"role": "user", "parts": [
        {"text": "what is in this picture?"},
        {"mime_type": "image/png", "data": png_bytes},
    ]}));
    store.append(&key, event.clone(), Default::default()).await?;

    // Read back as it was sent; the bytes were stored once, apart from the event.
    let read = store.get(&key, Default::default()).await?;
    assert_eq!(read.events[0].content, event.content);

    let stored: i64 =
        client(db.url()).await.query_one("SELECT sum(length(data))::bigint FROM adk_blobs", &[]).await?.get(0);
    assert_eq!(stored, 300_000, "stored apart, as raw bytes");
    Ok(())
}

fn render(seq: u64, event: &Event) {
    assert!(seq > 0 && !event.id.is_empty());
}

async fn follow(store: &PgSessionStore, key: adk_postgres_domain::SessionKey, app: AppName) -> anyhow::Result<()> {
    let session = store.get(&key, Default::default()).await?;

    use futures_util::StreamExt;

    // Everything after the version the caller already has (0: from the start).
    let mut feed = store.watch(&key, session.version).await?;
    while let Some(item) = feed.next().await {
        match item {
            Ok((seq, event)) => render(seq, &event),
            // Rolled over: follow the successor from its first event.
            Err(StoreError::SessionClosed { successor: Some(next), .. }) => {
                /* watch(next, 0) */
                break;
            }
            // Deleted or expired; rewound under us (re-read the session);
            // no database for a minute (resume with watch(key, last seq seen)).
            Err(other) => return Err(other.into()),
        }
    }

    // An app's new sessions and events, as hints.
    let mut notices = store.watch_app(&app).await?;
    while let Some(notice) = notices.next().await {
        match notice? {
            AppNotice::SessionCreated { key } => { /* … */ }
            AppNotice::EventAppended { key, seq } => { /* … */ }
            AppNotice::Reconnected => { /* notices were lost: re-read what you follow */ }
            _ => {}
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn following_a_session_and_an_app() -> anyhow::Result<()> {
    let db = test_database().await;
    client(db.url()).await.batch_execute("SELECT adk_set_change_feed(true)").await?;
    let store = store(db.url()).await;
    let (app, user) = names();
    let key = adk_postgres_tests::pg::new_session(&store, app.as_str(), user.as_str()).await;
    store.append(&key, Event::new("agent"), Default::default()).await?;
    let writer = {
        let (store, key) = (store.clone(), key.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            store.append(&key, Event::new("agent"), Default::default()).await.expect("append");
            store.rollover(&key, Some("next".into()), Event::new("agent")).await.expect("rollover");
        })
    };
    // The app's notices never end on their own: the snippet's second loop
    // runs until this test stops listening.
    let followed = tokio::time::timeout(Duration::from_secs(3), follow(&store, key, app)).await;
    writer.await?;
    assert!(followed.is_err(), "the session's feed ended at the rollover, the app's ran on: {followed:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn erasing_a_user() -> anyhow::Result<()> {
    let db = test_database().await;
    let store = store(db.url()).await;
    let (app, user) = names();
    let key = adk_postgres_tests::pg::new_session(&store, app.as_str(), user.as_str()).await;
    store.append(&key, Event::new("agent"), Default::default()).await?;

    let erased = store.erase_user(&app, &user).await?; // Erasure { sessions, events, user_state }
    // With progress and options (PgSessionStore only):
    let report = store
        .erase_user_with(&app, &user, EraseOptions { batch_size: 1_000, dry_run: false }, |p| eprintln!("{p}"))
        .await?;

    assert_eq!((erased.sessions, erased.events), (1, 1));
    assert_eq!(report.erasure().sessions, 0, "a second erasure finds nothing");
    Ok(())
}

// The README and docs/, kept navigable: the README stays a page long and no
// link or anchor in either points at nothing. Plain file reads, no database.

const README_MAX_LINES: usize = 300;

/// The workspace root; this crate is its `tests/` directory.
fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_owned()
}

/// README.md and every `.md` under docs/, by path relative to the root.
fn markdown_pages(root: &std::path::Path) -> std::collections::BTreeMap<std::path::PathBuf, String> {
    fn walk(
        root: &std::path::Path,
        dir: &std::path::Path,
        pages: &mut std::collections::BTreeMap<std::path::PathBuf, String>,
    ) {
        for entry in std::fs::read_dir(root.join(dir)).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
            let name = entry.expect("a directory entry").file_name();
            let path = dir.join(name);
            if root.join(&path).is_dir() {
                walk(root, &path, pages);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                pages.insert(path.clone(), read(root, &path));
            }
        }
    }
    let mut pages = std::collections::BTreeMap::new();
    pages.insert("README.md".into(), read(root, std::path::Path::new("README.md")));
    walk(root, std::path::Path::new("docs"), &mut pages);
    pages
}

fn read(root: &std::path::Path, path: &std::path::Path) -> String {
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The page's lines outside fenced code blocks, numbered from 1, with inline
/// code blanked out: neither can hold a link or a heading. A code span may
/// wrap onto the next line of its paragraph, so backticks pair up per
/// paragraph; an unpaired one is a literal backtick.
fn prose(page: &str) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let mut paragraph: Vec<(usize, String)> = Vec::new();
    let mut fenced = false;
    let flush = |paragraph: &mut Vec<(usize, String)>, lines: &mut Vec<(usize, String)>| {
        let ticks = paragraph.iter().map(|(_, l)| l.matches('`').count()).sum::<usize>();
        let mut pairable = ticks - ticks % 2;
        let mut in_code = false;
        for (number, line) in paragraph.drain(..) {
            let blanked = line
                .chars()
                .map(|c| {
                    if c == '`' && pairable > 0 {
                        pairable -= 1;
                        in_code = !in_code;
                        ' '
                    } else if in_code {
                        ' '
                    } else {
                        c
                    }
                })
                .collect();
            lines.push((number, blanked));
        }
    };
    for (index, line) in page.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            flush(&mut paragraph, &mut lines);
            fenced = !fenced;
        } else if !fenced {
            if line.trim().is_empty() || heading(line).is_some() {
                flush(&mut paragraph, &mut lines);
                lines.push((index + 1, line.to_owned()));
            } else {
                paragraph.push((index + 1, line.to_owned()));
            }
        }
    }
    flush(&mut paragraph, &mut lines);
    lines
}

/// The text of an ATX heading line (`## Text`), if it is one.
fn heading(line: &str) -> Option<&str> {
    let hashes = line.len() - line.trim_start_matches('#').len();
    let rest = &line[hashes..];
    ((1..=6).contains(&hashes) && rest.starts_with(' ')).then(|| rest.trim().trim_end_matches('#').trim())
}

/// GitHub's anchor for a heading: lowercase, spaces become `-`, and every
/// other character but letters, digits, `-` and `_` is dropped.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor a page's headings make; a repeated heading gets `-1`, `-2`…
fn anchors(page: &str) -> std::collections::BTreeSet<String> {
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    let mut anchors = std::collections::BTreeSet::new();
    for (_, line) in prose(page) {
        if let Some(text) = heading(&line) {
            let base = slug(text);
            let count = seen.entry(base.clone()).or_insert(0);
            anchors.insert(if *count == 0 { base } else { format!("{base}-{count}") });
            *count += 1;
        }
    }
    anchors
}

/// The targets of a line's inline links and images, `[text](target)`, without
/// an optional title.
fn link_targets(line: &str) -> Vec<&str> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(open) = rest.find("](") {
        let after = &rest[open + 2..];
        let Some(close) = after.find(')') else { break };
        targets.push(after[..close].split_whitespace().next().unwrap_or(""));
        rest = &after[close..];
    }
    targets
}

/// `path` with `.` and `..` resolved, without touching the file system.
fn normalize(path: &std::path::Path) -> std::path::PathBuf {
    let mut out = std::path::PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// Every relative link of `pages` whose file does not exist under `root`, or
/// whose `#anchor` names no heading of its page, as `page:line: why`.
fn broken_links(root: &std::path::Path, pages: &std::collections::BTreeMap<std::path::PathBuf, String>) -> Vec<String> {
    let mut broken = Vec::new();
    for (page, text) in pages {
        for (number, line) in prose(text) {
            for target in link_targets(&line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (file, anchor) = target.split_once('#').map_or((target, None), |(f, a)| (f, Some(a)));
                let path = if file.is_empty() {
                    page.clone()
                } else {
                    normalize(&page.parent().unwrap_or(std::path::Path::new("")).join(file))
                };
                let where_ = format!("{}:{number}: `{target}`", page.display());
                let linked = match pages.get(&path) {
                    Some(linked) => Some(linked.clone()),
                    None if root.join(&path).is_file() => std::fs::read_to_string(root.join(&path)).ok(),
                    None if root.join(&path).exists() => None,
                    None => {
                        broken.push(format!("{where_}: no file {}", path.display()));
                        continue;
                    }
                };
                if let Some(anchor) = anchor {
                    match linked {
                        Some(linked) if anchors(&linked).contains(anchor) => {}
                        Some(_) => broken.push(format!("{where_}: {} has no heading #{anchor}", path.display())),
                        None => broken.push(format!("{where_}: {} is not a page to have #{anchor}", path.display())),
                    }
                }
            }
        }
    }
    broken
}

#[test]
fn the_readme_fits_on_a_page() {
    let lines = read(&workspace_root(), std::path::Path::new("README.md")).lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move the detail to a page of docs/ and link it"
    );
}

/// Every version of each package in Cargo.lock, by name: the versions the
/// workspace builds and tests, its own crates included.
fn locked_versions(lock: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut versions: std::collections::BTreeMap<String, Vec<String>> = std::collections::BTreeMap::new();
    let mut name = None;
    for line in lock.lines() {
        if let Some(value) = line.strip_prefix("name = ") {
            name = Some(value.trim_matches('"').to_owned());
        } else if let (Some(value), Some(package)) = (line.strip_prefix("version = "), name.take()) {
            versions.entry(package).or_default().push(value.trim_matches('"').to_owned());
        }
    }
    versions
}

/// The `name@requirement` arguments of the README's `cargo add` lines.
fn cargo_add_requirements(readme: &str) -> Vec<(String, String)> {
    readme
        .lines()
        .filter_map(|line| line.trim().strip_prefix("cargo add "))
        .flat_map(str::split_whitespace)
        .filter(|argument| !argument.starts_with('-'))
        .map(|argument| match argument.split_once('@') {
            Some((name, requirement)) => (name.to_owned(), requirement.to_owned()),
            None => (argument.to_owned(), String::new()),
        })
        .collect()
}

/// What a user copies from the README resolves to what this workspace
/// builds: a release that moves our version, or a move to another
/// adk-rust minor version, fails here until the README follows it.
#[test]
fn the_readmes_cargo_add_lines_name_the_current_versions() {
    let root = workspace_root();
    let readme = read(&root, std::path::Path::new("README.md"));
    let locked = locked_versions(&read(&root, std::path::Path::new("Cargo.lock")));
    let named = cargo_add_requirements(&readme);
    for needed in ["adk-postgres-adk", "adk-core", "adk-runner", "adk-session"] {
        assert!(
            named.iter().any(|(name, _)| name == needed),
            "the README's `cargo add` lines lack {needed}: {named:?}"
        );
    }
    for (name, requirement) in &named {
        assert!(!requirement.is_empty(), "the README adds {name} without a version");
        let versions = locked.get(name).unwrap_or_else(|| panic!("the README adds {name}, which Cargo.lock lacks"));
        assert!(
            versions.iter().any(|version| version == requirement || version.starts_with(&format!("{requirement}."))),
            "the README adds {name}@{requirement}, the workspace builds {versions:?}"
        );
    }
    assert_eq!(
        locked["adk-postgres-adk"],
        [env!("CARGO_PKG_VERSION")],
        "the adapter is released with the workspace's version"
    );
}

#[test]
fn a_cargo_add_requirement_is_read_as_a_prefix_of_the_locked_version() {
    let readme = "```sh\ncargo add a@0.1 b@2.3\ncargo add c@2 --no-default-features\n```\ncargo add-on\n";
    let expected = [("a", "0.1"), ("b", "2.3"), ("c", "2")].map(|(n, r)| (n.to_owned(), r.to_owned()));
    assert_eq!(cargo_add_requirements(readme), expected);
    let lock = "[[package]]\nname = \"a\"\nversion = \"0.1.0\"\n\n[[package]]\nname = \"a\"\nversion = \"0.2.1\"\n";
    assert_eq!(locked_versions(lock)["a"], ["0.1.0", "0.2.1"]);
}

#[test]
fn every_link_in_the_docs_resolves() {
    let root = workspace_root();
    let pages = markdown_pages(&root);
    assert!(pages.len() > 10, "found only {:?}", pages.keys().collect::<Vec<_>>());
    let broken = broken_links(&root, &pages);
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn anchors_follow_githubs_slugs() {
    let page = "# Run it in production: `adk-pg`\n## Policy and maintenance\n## Policy and maintenance\n\
                ```sh\n# not a heading\n```\n### Snake_case, 1.0 and… more\n";
    let expected =
        ["run-it-in-production-adk-pg", "policy-and-maintenance", "policy-and-maintenance-1", "snake_case-10-and-more"];
    assert_eq!(anchors(page), expected.iter().map(|a| a.to_string()).collect());
}

#[test]
fn a_broken_link_or_anchor_is_reported() {
    let root = workspace_root();
    let page = "# Title\n\nSee [the api](docs/store-api.md#use-it), [this](#title) and `[code](nowhere.md)`.\n\
                Then [gone](docs/nowhere.md), [no such heading](docs/store-api.md#nowhere) and [here](#none).\n\
                ```md\n[fenced](nowhere.md)\n```\n";
    let pages = [(std::path::PathBuf::from("README.md"), page.to_owned())].into_iter().collect();
    let broken = broken_links(&root, &pages);
    assert_eq!(broken.len(), 3, "{broken:#?}");
    assert!(broken[0].contains("docs/nowhere.md"), "{broken:#?}");
    assert!(broken[1].contains("#nowhere"), "{broken:#?}");
    assert!(broken[2].contains("#none"), "{broken:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn paging_events_and_listing_an_app() -> anyhow::Result<()> {
    let db = test_database().await;
    let store = store(db.url()).await;
    let (app, user) = names();
    use adk_postgres_domain::{CreateSession, EventPage, ListAppSessions, SessionMetadata};
    let labelled = SessionMetadata::new().with_label("team", "red");
    let key = store.create(CreateSession::new(app.clone(), user.clone()).with_metadata(labelled)).await?.key;
    for _ in 0..250 {
        store.append(&key, Event::new("agent"), Default::default()).await?;
    }

    // The newest 100 events of a long session, then the 100 before them.
    let page = EventPage::last(100);
    let newest = store.list_events(&key, page).await?;
    let older = match newest.next(page) {
        Some(next) => store.list_events(&key, next).await?.events,
        None => Vec::new(),
    };

    // Every user's sessions of the app labelled team=red, newest created first.
    let request = ListAppSessions::new(app.clone()).with_label("team", "red");
    let listed = store.list_app_sessions(&request).await?;
    for summary in &listed.sessions {
        println!("{} {} v{}", summary.key.user_id, summary.key.session_id, summary.version);
    }

    assert_eq!((newest.events[0].seq, newest.version), (151, 250));
    assert_eq!((older[0].seq, older[99].seq), (51, 150));
    assert_eq!(listed.sessions.len(), 1);
    Ok(())
}
