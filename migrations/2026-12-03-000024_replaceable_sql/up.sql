-- From here on the store's functions live in crates/schema/sql/, one file
-- per area, and are installed after every migrate (crates/schema/src/
-- replaceable.rs). Migrations after this one hold tables, columns, indexes,
-- data moves, and a DROP FUNCTION when a signature goes away, never a
-- function body.
--
-- The one row says which text is installed, so an unchanged install (every
-- service start that migrates) runs nothing. Only the owner reads or writes
-- it; it holds no tenant's data.
CREATE TABLE adk_schema_sql (
    singleton    boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    sha256       text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    installed_at timestamptz NOT NULL DEFAULT now(),
    installed_by name NOT NULL DEFAULT CURRENT_USER
);
