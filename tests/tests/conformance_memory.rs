//! The conformance suite against the in-memory reference store.

adk_postgres_tests::conformance_tests!(adk_postgres_tests::conformance::MemoryFactory);
