//! Planning: the remaining steps, from the catalog alone. Everything the
//! swap could not handle is refused here, before anything is changed.

use std::fmt;

use adk_postgres_schema::quote::{quote_ident, quote_literal};
use chrono::NaiveDate;
use serde::Serialize;

use super::catalog::{Catalog, open};
use super::layout::{
    BASELINE_VERSION, EVENT_COLUMNS, EVENTS, KEY, LEGACY_EVENT_ID_KEY, LEGACY_FKEY, LEGACY_PARTITION, LEGACY_PKEY,
    LEGACY_RANGE, MIGRATIONS_TABLE, PAYLOAD_IS_OBJECT, SEQ_POSITIVE, SESSION_COLUMNS, SESSION_DAY, SESSION_DAY_DEFAULT,
    SESSIONS, SESSIONS_DAY, SESSIONS_KEY_DAY, embedded_versions, unrecognised,
};
use super::steps::{Action, ConvertStep, StepKind};
use super::swap::swap_actions;
use crate::RetentionError;
use crate::partitions::partition_name;
use adk_postgres_operations::LockPolicy;

/// What a conversion would do now: the `--dry-run` output.
#[derive(Debug, Clone, Serialize)]
pub struct ConvertPlan {
    /// The first day (UTC) of the new partitions; the legacy partition
    /// holds every day before it.
    pub cutover: NaiveDate,
    /// The schema holding `adk_events`.
    pub schema: String,
    /// Nothing left to do.
    pub already_converted: bool,
    /// The steps still to run, in order.
    pub steps: Vec<ConvertStep>,
}

impl fmt::Display for ConvertPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.already_converted {
            return writeln!(f, "-- adk_events in schema {} is already converted; nothing to do", self.schema);
        }
        writeln!(f, "-- converting adk_events in schema {} with cutover {}", self.schema, self.cutover)?;
        for step in &self.steps {
            writeln!(f, "\n-- step {} (guide step {}): {}", step.number, step.guide_step, step.title)?;
            for statement in &step.sql {
                writeln!(f, "{statement};")?;
            }
        }
        Ok(())
    }
}

/// The remaining steps with their exact SQL; empty when converted.
pub async fn plan_conversion(database_url: &str, cutover: NaiveDate) -> Result<Vec<ConvertStep>, RetentionError> {
    Ok(conversion_plan(database_url, cutover).await?.steps)
}

/// [`plan_conversion`] with the schema and a printable form.
pub async fn conversion_plan(database_url: &str, cutover: NaiveDate) -> Result<ConvertPlan, RetentionError> {
    let (mut conn, schema) = open(database_url, "adk-pg convert (plan)", &LockPolicy::default()).await?;
    let catalog = Catalog::read(&mut conn, &schema).await?;
    let steps = plan_steps(&catalog, cutover)?;
    Ok(ConvertPlan { cutover, schema, already_converted: steps.is_empty(), steps })
}

pub(super) fn plan_steps(catalog: &Catalog, cutover: NaiveDate) -> Result<Vec<ConvertStep>, RetentionError> {
    let events = catalog
        .relation(EVENTS)
        .ok_or_else(|| RetentionError::NotMigrated("table adk_events does not exist".into()))?;
    if catalog.relation(SESSIONS).is_none() {
        return Err(RetentionError::NotMigrated("table adk_sessions does not exist".into()));
    }
    let mut steps = Vec::new();
    let unpartitioned = match events.kind.as_str() {
        "p" => false,
        "r" => true,
        other => return Err(unrecognised(format!("adk_events is a relation of kind '{other}', not a table"))),
    };
    if unpartitioned {
        plan_before_swap(catalog, cutover, &mut steps)?;
    }
    plan_after_swap(catalog, unpartitioned, &mut steps)?;
    Ok(steps)
}

fn columns_are(columns: &[String], wanted: &[&str]) -> bool {
    columns.len() == wanted.len() && columns.iter().zip(wanted).all(|(a, b)| a == b)
}

/// Refuses what the swap could not handle, before anything is changed.
fn recognise(catalog: &Catalog, cutover: NaiveDate) -> Result<(), RetentionError> {
    let events = catalog.relation(EVENTS).ok_or_else(|| unrecognised("adk_events is missing".into()))?;
    if events.in_hierarchy {
        return Err(unrecognised("adk_events takes part in inheritance or partitioning".into()));
    }
    if events.secured {
        return Err(unrecognised(
            "adk_events has row-level security; the partitioned parent would need its own policies".into(),
        ));
    }
    if events.referenced_by > 0 {
        return Err(unrecognised("other tables have foreign keys pointing at adk_events".into()));
    }
    for (name, type_name, parent_not_null) in EVENT_COLUMNS {
        let column =
            catalog.column(EVENTS, name).ok_or_else(|| unrecognised(format!("adk_events.{name} is missing")))?;
        if column.type_name != type_name {
            return Err(unrecognised(format!("adk_events.{name} is {}, expected {type_name}", column.type_name)));
        }
        if parent_not_null && !column.not_null {
            return Err(unrecognised(format!("adk_events.{name} must be NOT NULL")));
        }
    }
    if let Some(extra) = catalog
        .columns
        .iter()
        .filter(|c| c.table_name == EVENTS)
        .find(|c| c.name != SESSION_DAY && !EVENT_COLUMNS.iter().any(|(name, _, _)| *name == c.name))
    {
        return Err(unrecognised(format!("adk_events has a column the partitioned parent lacks: {}", extra.name)));
    }
    for name in SESSION_COLUMNS {
        if catalog.column(SESSIONS, name).is_none() {
            return Err(unrecognised(format!("adk_sessions.{name} is missing")));
        }
    }
    let sessions_pkey = catalog.constraints.iter().find(|c| c.table_name == SESSIONS && c.kind == "p");
    if !sessions_pkey.is_some_and(|c| columns_are(&c.columns, &KEY[..3])) {
        return Err(unrecognised("adk_sessions' primary key is not (app_name, user_id, session_id)".into()));
    }
    let today = partition_name(cutover);
    for taken in [LEGACY_PARTITION, today.as_str()] {
        if catalog.relation(taken).is_some() {
            return Err(unrecognised(format!("{taken} already exists")));
        }
    }
    Ok(())
}

/// The date of a constant default such as `'2026-11-04'::date`.
fn constant_day(default_expr: Option<&str>) -> Option<NaiveDate> {
    let inner = default_expr?.strip_prefix('\'')?.strip_suffix("'::date")?;
    NaiveDate::parse_from_str(inner, "%Y-%m-%d").ok()
}

/// `pg_get_constraintdef` of a constraint that is not validated yet ends in
/// ` NOT VALID`; compare definitions without it.
fn without_not_valid(definition: &str) -> &str {
    definition.strip_suffix(" NOT VALID").unwrap_or(definition)
}

fn plan_before_swap(catalog: &Catalog, cutover: NaiveDate, steps: &mut Vec<ConvertStep>) -> Result<(), RetentionError> {
    recognise(catalog, cutover)?;
    let legacy_day = cutover
        .pred_opt()
        .ok_or_else(|| RetentionError::InvalidInput { field: "cutover", reason: "has no day before it".into() })?;
    let (events, sessions) = (quote_ident(EVENTS), quote_ident(SESSIONS));
    let day = quote_ident(SESSION_DAY);

    // [1] session_day on both tables.
    match (catalog.column(SESSIONS, SESSION_DAY), catalog.column(EVENTS, SESSION_DAY)) {
        (None, None) => {
            let add = |table: &str| {
                format!(
                    "ALTER TABLE {table} ADD COLUMN {day} date NOT NULL DEFAULT {}",
                    quote_literal(&legacy_day.to_string())
                )
            };
            // Sessions first, the order appends lock in; one transaction so
            // both tables get the same legacy day.
            steps.push(ConvertStep::new(
                StepKind::AddSessionDay,
                vec![Action::Ddl(format!("{}; {}", add(&sessions), add(&events)))],
            ));
        }
        (Some(s), Some(e)) => {
            for column in [s, e] {
                if column.type_name != "date" || !column.not_null {
                    return Err(unrecognised(format!("{}.session_day is not date NOT NULL", column.table_name)));
                }
                if let Some(earlier) = constant_day(column.default_expr.as_deref())
                    && earlier >= cutover
                {
                    return Err(RetentionError::Conflict(format!(
                        "an earlier run gave the legacy rows the day {earlier}, which is not before the cutover \
                         {cutover}; rerun with the cutover that run used ({})",
                        earlier.succ_opt().unwrap_or(earlier)
                    )));
                }
            }
        }
        (Some(_), None) => {
            return Err(unrecognised("adk_sessions has session_day but adk_events does not".into()));
        }
        (None, Some(_)) => {
            return Err(unrecognised("adk_events has session_day but adk_sessions does not".into()));
        }
    }

    // [3] Indexes and constraints, built with weak locks before the swap.
    let events_key: Vec<&str> = KEY.iter().copied().chain(["seq"]).collect();
    let events_id_key: Vec<&str> = KEY.iter().copied().chain(["event_id"]).collect();
    steps.extend(index_step(catalog, StepKind::SessionsKeyDayIndex, SESSIONS, SESSIONS_KEY_DAY, true, &KEY)?);
    match catalog.constraint(SESSIONS, SESSIONS_KEY_DAY) {
        Some(c) if c.kind == "u" && columns_are(&c.columns, &KEY) => {}
        Some(c) => return Err(unrecognised(format!("constraint {} exists as {}", c.name, c.definition))),
        None => steps.push(ConvertStep::new(
            StepKind::SessionsKeyDayConstraint,
            vec![Action::Ddl(format!(
                "ALTER TABLE {sessions} ADD CONSTRAINT {key} UNIQUE USING INDEX {key}",
                key = quote_ident(SESSIONS_KEY_DAY)
            ))],
        )),
    }
    steps.extend(index_step(catalog, StepKind::SessionsDayIndex, SESSIONS, SESSIONS_DAY, false, &[SESSION_DAY])?);
    steps.extend(index_step(catalog, StepKind::EventsKeyIndex, EVENTS, LEGACY_PKEY, true, &events_key)?);
    steps.extend(index_step(catalog, StepKind::EventsEventIdIndex, EVENTS, LEGACY_EVENT_ID_KEY, true, &events_id_key)?);

    let cutover_literal = quote_literal(&cutover.to_string());
    let checks = [
        (
            LEGACY_RANGE,
            // An explicit date comparison: the attach proves the partition
            // bound from exactly this shape.
            format!("{day} < {cutover_literal}::date"),
            format!("CHECK ((session_day < '{cutover}'::date))"),
        ),
        (SEQ_POSITIVE, "seq > 0".to_owned(), "CHECK ((seq > 0))".to_owned()),
        (
            PAYLOAD_IS_OBJECT,
            "jsonb_typeof(payload) = 'object'".to_owned(),
            "CHECK ((jsonb_typeof(payload) = 'object'::text))".to_owned(),
        ),
    ];
    let mut actions = Vec::new();
    for (name, expression, expected) in checks {
        let validate = Action::Validate(format!("ALTER TABLE {events} VALIDATE CONSTRAINT {}", quote_ident(name)));
        match catalog.constraint(EVENTS, name) {
            None => {
                actions.push(Action::Ddl(format!(
                    "ALTER TABLE {events} ADD CONSTRAINT {} CHECK ({expression}) NOT VALID",
                    quote_ident(name)
                )));
                actions.push(validate);
            }
            Some(c) if c.kind == "c" && without_not_valid(&c.definition) == expected => {
                if !c.validated {
                    actions.push(validate);
                }
            }
            Some(c) if name == LEGACY_RANGE => {
                return Err(RetentionError::Conflict(format!(
                    "an earlier run started this conversion with another cutover ({}); rerun with that cutover",
                    c.definition
                )));
            }
            Some(c) => {
                return Err(unrecognised(format!(
                    "adk_events has {} as {}, expected {expected}",
                    c.name, c.definition
                )));
            }
        }
    }
    if !actions.is_empty() {
        steps.push(ConvertStep::new(StepKind::EventsChecks, actions));
    }

    let key_list = KEY.map(quote_ident).join(", ");
    let fkey_expected = "FOREIGN KEY (app_name, user_id, session_id, session_day) REFERENCES \
                         adk_sessions(app_name, user_id, session_id, session_day) ON DELETE CASCADE";
    let validate_fkey =
        Action::Validate(format!("ALTER TABLE {events} VALIDATE CONSTRAINT {}", quote_ident(LEGACY_FKEY)));
    match catalog.constraint(EVENTS, LEGACY_FKEY) {
        None => steps.push(ConvertStep::new(
            StepKind::EventsForeignKey,
            vec![
                // Adding the key locks adk_events and then adk_sessions,
                // while an append locks adk_sessions (ROW SHARE for its
                // FOR UPDATE, or ROW EXCLUSIVE, depending on whether the
                // statement is parsed or replanned) before adk_events: the
                // two deadlock and the live append fails. EXCLUSIVE is the
                // weakest mode that conflicts with both, so taking it first
                // lets every append either finish or wait before it touches
                // adk_events. Plain reads are not blocked.
                Action::Ddl(format!(
                    "LOCK TABLE {sessions} IN EXCLUSIVE MODE; \
                     ALTER TABLE {events} ADD CONSTRAINT {} FOREIGN KEY ({key_list}) \
                     REFERENCES {sessions} ({key_list}) ON DELETE CASCADE NOT VALID",
                    quote_ident(LEGACY_FKEY)
                )),
                validate_fkey,
            ],
        )),
        Some(c) if c.kind == "f" && without_not_valid(&c.definition) == fkey_expected => {
            if !c.validated {
                steps.push(ConvertStep::new(StepKind::EventsForeignKey, vec![validate_fkey]));
            }
        }
        Some(c) => return Err(unrecognised(format!("adk_events has {} as {}", c.name, c.definition))),
    }

    // [4] The swap.
    steps.push(ConvertStep::new(StepKind::Swap, swap_actions(catalog, cutover)?));
    Ok(())
}

/// The step that builds index `name` concurrently, unless a valid one with
/// that definition exists. An INVALID one (an interrupted build) is dropped
/// and rebuilt; a valid one with another definition is refused.
fn index_step(
    catalog: &Catalog,
    kind: StepKind,
    table: &str,
    name: &str,
    unique: bool,
    columns: &[&str],
) -> Result<Option<ConvertStep>, RetentionError> {
    let create = format!(
        "CREATE {}INDEX CONCURRENTLY {} ON {} ({})",
        if unique { "UNIQUE " } else { "" },
        quote_ident(name),
        quote_ident(table),
        columns.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ")
    );
    let drop = match catalog.index(name) {
        Some(index) if index.valid => {
            if index.table_name != table
                || index.is_unique != unique
                || !index.plain
                || !columns_are(&index.columns, columns)
            {
                return Err(unrecognised(format!(
                    "index {name} exists with another definition (on {}, columns {:?})",
                    index.table_name, index.columns
                )));
            }
            return Ok(None);
        }
        Some(_) => Some(format!("DROP INDEX CONCURRENTLY IF EXISTS {}", quote_ident(name))),
        None if catalog.relation(name).is_some() => {
            return Err(unrecognised(format!("{name} exists and is not an index")));
        }
        None => None,
    };
    Ok(Some(ConvertStep::new(kind, vec![Action::BuildIndex { index: name.to_owned(), drop, create }])))
}

fn plan_after_swap(catalog: &Catalog, unpartitioned: bool, steps: &mut Vec<ConvertStep>) -> Result<(), RetentionError> {
    // [5] New sessions get today's day. Before the swap this is always
    // still to do; after it, the default says whether it was done.
    let default_done = !unpartitioned
        && catalog
            .column(SESSIONS, SESSION_DAY)
            .ok_or_else(|| unrecognised("adk_events is partitioned but adk_sessions has no session_day".into()))?
            .default_expr
            .as_deref()
            .is_some_and(|d| d.contains("now()"));
    if !default_done {
        steps.push(ConvertStep::new(
            StepKind::SessionsDefault,
            vec![Action::Ddl(format!(
                "ALTER TABLE {} ALTER COLUMN {} SET DEFAULT {SESSION_DAY_DEFAULT}",
                quote_ident(SESSIONS),
                quote_ident(SESSION_DAY)
            ))],
        ));
    }

    // Diesel's bookkeeping: 000001 is what the conversion did.
    let mut recorded = catalog.migrations.clone().unwrap_or_default();
    if !recorded.contains(BASELINE_VERSION) {
        steps.push(ConvertStep::new(
            StepKind::RecordBaseline,
            vec![Action::RecordBaseline {
                create: format!(
                    "CREATE TABLE IF NOT EXISTS {} (version VARCHAR(50) PRIMARY KEY NOT NULL, \
                     run_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP)",
                    quote_ident(MIGRATIONS_TABLE)
                ),
            }],
        ));
        recorded.insert(BASELINE_VERSION.to_owned());
    }
    let pending: Vec<String> = embedded_versions()?.into_iter().filter(|v| !recorded.contains(v)).collect();
    if !pending.is_empty() {
        steps.push(ConvertStep::new(StepKind::ApplyMigrations, vec![Action::ApplyMigrations { pending }]));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_constant_defaults() {
        let day = NaiveDate::from_ymd_opt(2026, 11, 4);
        assert_eq!(constant_day(Some("'2026-11-04'::date")), day);
        assert_eq!(constant_day(Some("((now() AT TIME ZONE 'UTC'::text))::date")), None);
        assert_eq!(constant_day(None), None);
        assert_eq!(without_not_valid("CHECK ((seq > 0)) NOT VALID"), "CHECK ((seq > 0))");
    }
}
