-- Tenancy on Citus. Row-level security on a shard calls adk_acting_app(),
-- whose read of the bindings (a reference table) Citus refuses inside a
-- shard query as nested distributed execution. The refusal guards against
-- reading other shards of distributed tables from a worker; a reference
-- table has a full copy on every node, so the nested read is local and
-- exact.

ALTER FUNCTION adk_acting_app() SET citus.allow_nested_distributed_execution = on;
