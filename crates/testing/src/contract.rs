//! Running contract suites: the same cases against every backend.
//!
//! A contract suite is a module of cases, each a `pub async fn` taking a
//! reference to what the suite runs against (a factory of stores, a
//! service), listed once in the suite. [`contract_tests!`] makes the tests
//! of one backend from that list, so every backend runs every listed case
//! and a case added to the list reaches them all.

/// One `#[tokio::test]` per case: `$suite::$case(&subject)` on a fresh
/// subject from `$subject`, evaluated (and awaited, if it says so) inside
/// each test.
///
/// ```ignore
/// adk_postgres_testing::contract_tests!(crate::suite => PgFactory::default(); create_keeps_its_id, delete_is_idempotent);
/// ```
///
/// Each test gets its own subject, so what the subject holds (a database,
/// roles, a pool) lives exactly as long as the case. The runtime has several
/// worker threads because many cases race tasks against each other, and a
/// race on one thread proves nothing.
///
/// A backend that needs what a server build may lack names it after the
/// subject; on a server without it every case ends before making the
/// subject, saying so ([`crate::skip_without`]):
///
/// ```ignore
/// adk_postgres_testing::contract_tests!(crate::suite => over_tls().await, requires Capability::Tls; create_keeps_its_id);
/// ```
#[macro_export]
macro_rules! contract_tests {
    ($suite:path => $subject:expr; $($case:ident),* $(,)?) => {
        $crate::contract_tests!(@cases $suite => $subject, {}; $($case),*);
    };
    ($suite:path => $subject:expr, requires $capability:expr; $($case:ident),* $(,)?) => {
        $crate::contract_tests!(@cases $suite => $subject, {
            if $crate::skip_without($capability).await {
                return;
            }
        }; $($case),*);
    };
    (@cases $suite:path => $subject:expr, $guard:block; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                use $suite as suite;
                $guard
                let subject = $subject;
                suite::$case(&subject).await;
            }
        )*
    };
}
