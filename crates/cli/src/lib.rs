//! `adk-pg` as a library: the human-readable renderings of its reports, so
//! other tools (the demo) print exactly what `adk-pg status` prints.

pub mod render;
