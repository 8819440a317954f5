//! `adk-pg serve` against a real PostgreSQL: the HTTP endpoints and the
//! metrics scrape, and the dashboard in a real browser.
//!
//! One binary for the area: each file is a module named for the behaviour
//! it pins; `fixture` starts the server on a store with traffic.

mod dashboard_browser;
mod fixture;
mod http;
