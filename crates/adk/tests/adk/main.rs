//! The adk-rust adapter: the SessionService contract suite on every
//! backend (and, opt-in, against adk-session's own PostgreSQL service), what
//! the adapter promises beyond it, a crowd through the trait, a real Runner
//! end to end, adk-session's `EncryptedSession` over it, and the README's path.
//!
//! One binary for the crate's tests: each file is a module named for what
//! it pins; `suite` holds the contract cases they share.

#[macro_use]
mod suite;

mod adapter;
mod compare_builtin;
mod contract;
mod crowd;
mod encrypted_session;
mod media;
mod one_invocation;
mod readme_path;
mod runner_e2e;
