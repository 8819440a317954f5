//! The README's "Use with adk-rust" path, kept honest: its snippet must be the
//! excerpt of `examples/quickstart.rs`, and that example must work on a
//! database nothing has touched — no `adk-pg maintain`, no migrations, no
//! partitions made beforehand (issue #10: the documented path once failed on
//! its first append with `session.partition_missing`).

const README: &str = include_str!("../../../../README.md");
const EXAMPLE: &str = include_str!("../../examples/quickstart.rs");
const SECTION: &str = "## Use with adk-rust";
const BEGIN: &str = "// README: begin";
const END: &str = "// README: end";

// `main` belongs to the example binary; the test calls `run` itself.
#[cfg(feature = "postgres")]
#[allow(dead_code)]
#[path = "../../examples/quickstart.rs"]
mod quickstart;

/// The example's lines strictly between the markers.
fn example_excerpt() -> &'static str {
    let begin = marker_line(BEGIN);
    let end = marker_line(END);
    assert!(begin.end < end.start, "crates/adk/examples/quickstart.rs: `{BEGIN}` must come before `{END}`");
    &EXAMPLE[begin.end..end.start]
}

/// The byte range of the one line of the example that is `marker`,
/// including its newline.
fn marker_line(marker: &str) -> std::ops::Range<usize> {
    let mut offset = 0;
    let mut found = Vec::new();
    for line in EXAMPLE.split_inclusive('\n') {
        if line.trim() == marker {
            found.push(offset..offset + line.len());
        }
        offset += line.len();
    }
    match found.as_slice() {
        [one] => one.clone(),
        _ => panic!("crates/adk/examples/quickstart.rs must have exactly one `{marker}` line, found {}", found.len()),
    }
}

/// The first ```rust block of the README's "Use with adk-rust" section.
fn readme_snippet() -> &'static str {
    let start = README
        .find(&format!("\n{SECTION}\n"))
        .unwrap_or_else(|| panic!("README.md has no `{SECTION}` section; the quickstart's snippet belongs there"));
    let section = &README[start + 1..];
    let section = &section[..section[SECTION.len()..].find("\n## ").map_or(section.len(), |i| i + SECTION.len())];
    let open =
        section.find("```rust\n").unwrap_or_else(|| panic!("README.md's `{SECTION}` section has no ```rust block"))
            + "```rust\n".len();
    let close = section[open..]
        .find("\n```")
        .unwrap_or_else(|| panic!("README.md's `{SECTION}` section: the ```rust block is not closed"));
    &section[open..open + close]
}

#[test]
fn the_readme_snippet_is_the_examples_excerpt() {
    let (readme, example) = (readme_snippet().trim(), example_excerpt().trim());
    if readme == example {
        return;
    }
    let line = readme.lines().zip(example.lines()).position(|(a, b)| a != b).unwrap_or_else(|| {
        readme.lines().count().min(example.lines().count()) // one is a prefix of the other
    });
    panic!(
        "README.md's `{SECTION}` rust block differs from crates/adk/examples/quickstart.rs between `{BEGIN}` and \
         `{END}`, first at line {} of the snippet:\n  README:  {:?}\n  example: {:?}\n\
         Edit the example (CI compiles and runs it), then copy its excerpt into the README verbatim.",
        line + 1,
        readme.lines().nth(line).unwrap_or("<end of block>"),
        example.lines().nth(line).unwrap_or("<end of excerpt>"),
    );
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_readme_path_works_on_an_empty_database() {
    use adk_postgres_adk::PgSessionService;
    use adk_session::{GetRequest, ListRequest, SessionService};

    let db = adk_postgres_testing::empty_database().await;
    let agent = quickstart::offline_agent().expect("build the offline agent");

    let started = std::time::Instant::now();
    let result = quickstart::run(db.url(), agent).await;
    let elapsed = started.elapsed();
    eprintln!("readme_path: quickstart::run on an empty database took {elapsed:?}");
    let conversation = result.unwrap_or_else(|e| panic!("the README's path failed on an empty database: {e}"));

    let ids = |events: &[adk_core::Event]| events.iter().map(|e| e.id.clone()).collect::<Vec<_>>();
    let text = |event: &adk_core::Event| -> String {
        event.content().iter().flat_map(|c| c.parts.iter()).filter_map(|p| p.text()).collect()
    };

    // Appended: the user's message, then the agent's answer.
    let stored = &conversation.stored;
    assert!(!conversation.streamed.is_empty(), "the runner streamed no events");
    assert!(stored.len() >= 2, "only {} events stored: {:?}", stored.len(), ids(stored));
    assert_eq!(stored[0].author, "user");
    assert_eq!(text(&stored[0]), "Where is my order?");
    let last = stored.last().expect("events");
    assert_eq!(last.author, "assistant");
    assert_eq!(text(last), "turn 1: Where is my order?");

    // Get returns what the runner streamed, in order.
    let stored_ids = ids(stored);
    let streamed_ids = ids(&conversation.streamed);
    assert!(stored_ids.ends_with(&streamed_ids), "get returned {stored_ids:?}, the runner streamed {streamed_ids:?}");

    // List shows the session; rewind dropped exactly the last event.
    assert_eq!(conversation.listed, std::slice::from_ref(&conversation.session_id));
    assert_eq!(ids(&conversation.rewound), stored_ids[..stored_ids.len() - 1]);

    // A second pool sees the same: the rewind is in the database, not a cache.
    let reader = PgSessionService::connect(db.url()).await.expect("reconnect");
    let request = GetRequest {
        app_name: "support".into(),
        user_id: "u-42".into(),
        session_id: conversation.session_id.clone(),
        num_recent_events: None,
        after: None,
    };
    let reread = reader.get(request).await.expect("get after the rewind").events().all();
    assert_eq!(ids(&reread), ids(&conversation.rewound), "a new connection reads a different history");
    let request = ListRequest { app_name: "support".into(), user_id: "u-42".into(), limit: None, offset: None };
    let listed: Vec<String> = reader.list(request).await.expect("list").iter().map(|s| s.id().to_owned()).collect();
    assert_eq!(listed, std::slice::from_ref(&conversation.session_id));
}
