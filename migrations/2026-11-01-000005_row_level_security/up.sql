-- Row-level security keyed by the app name, on all four tables. A role
-- that is not the tables' owner sees and writes only the rows of the app in
-- `adk.app_name`, which the store sets per transaction in its tenant-scoped
-- mode; with the setting absent it sees nothing at all. The owner is not
-- subject to these policies (no FORCE), so a single-tenant deployment that
-- runs as the owner behaves exactly as before. See README "Security".
--
-- Policies on the partitioned adk_events apply to every query through the
-- parent; the service role is granted the parent only, never a partition.

ALTER TABLE adk_sessions ENABLE ROW LEVEL SECURITY;
CREATE POLICY adk_tenant_isolation ON adk_sessions
    USING (app_name = current_setting('adk.app_name', true))
    WITH CHECK (app_name = current_setting('adk.app_name', true));

ALTER TABLE adk_events ENABLE ROW LEVEL SECURITY;
CREATE POLICY adk_tenant_isolation ON adk_events
    USING (app_name = current_setting('adk.app_name', true))
    WITH CHECK (app_name = current_setting('adk.app_name', true));

ALTER TABLE adk_user_states ENABLE ROW LEVEL SECURITY;
CREATE POLICY adk_tenant_isolation ON adk_user_states
    USING (app_name = current_setting('adk.app_name', true))
    WITH CHECK (app_name = current_setting('adk.app_name', true));

ALTER TABLE adk_app_states ENABLE ROW LEVEL SECURITY;
CREATE POLICY adk_tenant_isolation ON adk_app_states
    USING (app_name = current_setting('adk.app_name', true))
    WITH CHECK (app_name = current_setting('adk.app_name', true));
