//! The typed wrappers of the store's SQL functions against `pg_proc`: every
//! wrapper's arguments and result columns (names, types, order) must be the
//! function's, and every function the store exposes to a service role must
//! have a wrapper. A migration that changes a signature without the wrapper,
//! or a wrapper changed without its migration, fails here.

use adk_postgres_storage::functions::{SIGNATURES, Signature};
use diesel::QueryableByName;
use diesel::sql_types::{Array, Text};
use diesel_async::RunQueryDsl;

#[derive(QueryableByName, Debug, PartialEq, Eq)]
struct Described {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Array<Text>)]
    arguments: Vec<String>,
    #[diesel(sql_type = Array<Text>)]
    columns: Vec<String>,
}

/// Each function of the schema with its input arguments and result columns
/// as `name type`, in order. A function without OUT/TABLE columns returns
/// one column named after itself.
const DESCRIBE_SQL: &str = "
SELECT p.proname::text AS name,
       coalesce((SELECT array_agg(a.name || ' ' || pg_catalog.format_type(a.type, NULL) ORDER BY a.ord)
                   FROM unnest(coalesce(p.proallargtypes, p.proargtypes::oid[]), p.proargnames,
                               coalesce(p.proargmodes, array_fill('i'::\"char\", ARRAY[p.pronargs::int])))
                        WITH ORDINALITY AS a(type, name, mode, ord)
                  WHERE a.mode IN ('i', 'b', 'v')), '{}') AS arguments,
       coalesce((SELECT array_agg(a.name || ' ' || pg_catalog.format_type(a.type, NULL) ORDER BY a.ord)
                   FROM unnest(p.proallargtypes, p.proargnames, p.proargmodes)
                        WITH ORDINALITY AS a(type, name, mode, ord)
                  WHERE a.mode IN ('o', 'b', 't')),
                ARRAY[p.proname || ' ' || pg_catalog.format_type(p.prorettype, NULL)]) AS columns
  FROM pg_catalog.pg_proc p
 WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'adk\\_%'
 ORDER BY 1";

/// The tenant check the store functions make inside; the store never calls
/// them itself.
const TENANT_HELPERS: [&str; 3] = ["adk_acting_app", "adk_tenant_allows", "adk_tenant_require"];

fn expected(signature: &Signature) -> Described {
    let pairs = |list: &[(&str, &str)]| list.iter().map(|(name, ty)| format!("{name} {ty}")).collect::<Vec<_>>();
    Described {
        name: signature.name.to_owned(),
        arguments: pairs(signature.arguments),
        columns: pairs(signature.columns),
    }
}

async fn described(url: &str) -> Vec<Described> {
    let mut conn = adk_postgres_connect::establish(url).await.expect("connect");
    diesel::sql_query(DESCRIBE_SQL).load(&mut conn).await.expect("describe the functions")
}

#[tokio::test]
async fn every_wrapper_matches_its_function_in_pg_proc() {
    let db = adk_postgres_testing::test_database().await;
    let functions = described(db.url()).await;
    let mut drift = Vec::new();
    for signature in SIGNATURES {
        let want = expected(signature);
        let mut same_name = functions.iter().filter(|f| f.name == signature.name);
        match (same_name.next(), same_name.next()) {
            (None, _) => drift.push(format!("{}: no such function in the database", signature.name)),
            // A migration that changed an argument's type with CREATE OR
            // REPLACE made a second function beside the first.
            (Some(_), Some(_)) => drift.push(format!("{}: overloaded in the database", signature.name)),
            (Some(have), None) if *have != want => drift.push(format!(
                "{}:\n  wrapper:  {:?} -> {:?}\n  database: {:?} -> {:?}",
                signature.name, want.arguments, want.columns, have.arguments, have.columns
            )),
            (Some(_), None) => {}
        }
    }
    assert!(drift.is_empty(), "the typed wrappers and the migrations disagree:\n{}", drift.join("\n"));
}

#[tokio::test]
async fn every_function_a_service_role_may_run_has_a_wrapper() {
    let db = adk_postgres_testing::test_database().await;
    let mut conn = adk_postgres_connect::establish(db.url()).await.expect("connect");
    #[derive(QueryableByName)]
    struct Name {
        #[diesel(sql_type = Text)]
        name: String,
    }
    // SECURITY DEFINER functions taking the tenant: the store's surface.
    let surface: Vec<Name> = diesel::sql_query(
        "SELECT p.proname::text AS name FROM pg_catalog.pg_proc p
          WHERE p.pronamespace = current_schema()::regnamespace AND p.prosecdef
            AND (p.proargnames @> ARRAY['p_tenant'] OR p.pronargs = 0)
          ORDER BY 1",
    )
    .load(&mut conn)
    .await
    .expect("list the store's functions");
    let wrapped: Vec<&str> = SIGNATURES.iter().map(|s| s.name).collect();
    let unwrapped: Vec<&str> = surface
        .iter()
        .map(|n| n.name.as_str())
        .filter(|name| !wrapped.contains(name) && !TENANT_HELPERS.contains(name))
        .collect();
    assert!(unwrapped.is_empty(), "store functions without a typed wrapper: {unwrapped:?}");
    for name in wrapped {
        assert!(
            surface.iter().any(|n| n.name == name),
            "{name} is wrapped but is not a SECURITY DEFINER store function"
        );
    }
}
