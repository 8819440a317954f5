DROP POLICY IF EXISTS adk_tenant_isolation ON adk_app_states;
ALTER TABLE adk_app_states DISABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS adk_tenant_isolation ON adk_user_states;
ALTER TABLE adk_user_states DISABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS adk_tenant_isolation ON adk_events;
ALTER TABLE adk_events DISABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS adk_tenant_isolation ON adk_sessions;
ALTER TABLE adk_sessions DISABLE ROW LEVEL SECURITY;
