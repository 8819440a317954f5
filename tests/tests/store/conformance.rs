//! The conformance suite against both stores: the PostgreSQL store, each
//! test on a freshly migrated database of its own, and the in-memory
//! reference store.

mod postgres {
    use std::sync::Arc;

    use adk_postgres_domain::{SessionStore, StoreConfig};
    use adk_postgres_testing::{TestDatabase, test_database};
    use adk_postgres_tests::conformance::StoreFactory;
    use adk_postgres_tests::pg::store_with;
    use tokio::sync::OnceCell;

    /// One database per test, created on first use and dropped with the factory
    /// at the end of the test; every store a case asks for is a pool on it.
    #[derive(Debug, Default)]
    struct PgFactory {
        db: OnceCell<TestDatabase>,
    }

    impl StoreFactory for PgFactory {
        async fn store(&self, config: StoreConfig) -> Arc<dyn SessionStore> {
            let db = self.db.get_or_init(test_database).await;
            Arc::new(store_with(db.url(), config).await)
        }
    }

    adk_postgres_tests::conformance_tests!(PgFactory::default());
}

mod memory {
    adk_postgres_tests::conformance_tests!(adk_postgres_tests::conformance::MemoryFactory);
}
