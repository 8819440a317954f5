//! Shared helpers of the integration tests.

pub mod conformance;
pub mod pg;

/// For [`conformance_tests!`], which expands in the test crates, where this
/// crate's dependencies are not in scope.
#[doc(hidden)]
pub use adk_postgres_testing as testing;
