//! Shared helpers of the integration tests.

pub mod conformance;
pub mod pg;
