//! The session store against a real PostgreSQL: the conformance suite on
//! both stores, then what only PostgreSQL can show (plans, HOT updates,
//! acknowledgements, faults, the change feed, erasure, forks, metadata),
//! the schema the migrations and the SQL files make, and the store reaching
//! the databases users run (TLS, rotating credentials, a pooler, a failover,
//! a silent network).
//!
//! One binary for the area: each file is a module named for the behaviour
//! it pins.

mod acknowledged_means_committed;
mod change_feed;
mod conformance;
mod crowd;
mod data_model;
mod erase_user;
mod faults;
mod feature_docs;
mod fork;
mod function_statements;
mod media;
mod observability;
mod paging;
mod plan_cache;
mod postgres_only;
mod reaching_databases;
mod replaceable_sql;
mod session_metadata;
mod sql_wrappers;
