-- Media moved out of the log (crates/domain/src/blob.rs): read back with
-- the events that name it, and counted down as those events leave.
--
-- Installed after every migrate, in one transaction with the other files
-- (crates/schema/src/replaceable.rs). Each function is stated whole, with
-- its SET clauses and grants: change it here, not in a migration.

-- The blobs of one session that a get or a feed read found references to.
-- Only blobs some event of this session names are returned: a hash alone,
-- guessed or learned elsewhere, reads nothing, even within the app. A second
-- call, made only when an event read holds references, so a session without
-- media reads in one round trip as before.
CREATE OR REPLACE FUNCTION adk_get_blobs(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_sha256 bytea[])
 RETURNS TABLE(sha256 bytea, data bytea)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF NOT adk_tenant_allows(p_tenant, p_app_name) THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT b.sha256, b.data
      FROM adk_blobs b
     WHERE b.app_name = p_app_name AND b.sha256 = ANY (p_sha256)
       AND b.sha256 IN (SELECT pg_catalog.unnest(e.blob_refs)
                          FROM adk_sessions s
                          JOIN adk_events e
                            ON e.app_name = s.app_name AND e.user_id = s.user_id
                           AND e.session_id = s.session_id AND e.session_day = s.session_day
                         WHERE s.app_name = p_app_name AND s.user_id = p_user_id AND s.session_id = p_session_id
                           AND (s.expires_at IS NULL OR s.expires_at > pg_catalog.now())
                           AND e.blob_refs IS NOT NULL);
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_get_blobs(p_tenant text, p_app_name text, p_user_id text, p_session_id text, p_sha256 bytea[]) FROM PUBLIC;

-- The hash of each piece of an event's media, in the order sent: its
-- blob_refs. Computed here, never taken from the client, so a reference
-- always names the bytes that were sent with it; computed once per append,
-- and handed to adk_hold_blobs with the bytes.
CREATE OR REPLACE FUNCTION adk_blob_hashes(p_blobs bytea[]) RETURNS bytea[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN ARRAY(SELECT pg_catalog.sha256(u.d) FROM pg_catalog.unnest(p_blobs) WITH ORDINALITY u(d, n) ORDER BY u.n);
REVOKE EXECUTE ON FUNCTION adk_blob_hashes(p_blobs bytea[]) FROM PUBLIC;

-- Adds one reference to each blob of an event just stored in `p_app_name`
-- (`p_hashes` from adk_blob_hashes, beside the bytes they hash), storing the
-- bytes the first time. Its caller has stored the event, so a blob never
-- exists without an event that names it. Each blob is counted once per
-- event, however often the event names it. Rows are taken in hash order,
-- so two appends sharing blobs lock them in the same order and never
-- deadlock on them.
CREATE OR REPLACE FUNCTION adk_hold_blobs(p_app_name text, p_hashes bytea[], p_blobs bytea[]) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
BEGIN
    INSERT INTO adk_blobs AS b (app_name, sha256, size, refs, data)
    SELECT p_app_name, sent.h, pg_catalog.length(sent.d), 1, sent.d
      FROM (SELECT DISTINCT ON (u.h) u.h, u.d
              FROM ROWS FROM (pg_catalog.unnest(p_hashes), pg_catalog.unnest(p_blobs)) u(h, d)
             ORDER BY u.h) sent
     ORDER BY sent.h
    ON CONFLICT (app_name, sha256) DO UPDATE SET refs = b.refs + 1;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_hold_blobs(p_app_name text, p_hashes bytea[], p_blobs bytea[]) FROM PUBLIC;

-- Adds a reference to each blob named by the events of `p_session_id`: the
-- copies a fork just made of another session's events.
CREATE OR REPLACE FUNCTION adk_hold_copied_blobs(p_app_name text, p_user_id text, p_session_id text, p_day date) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
BEGIN
    UPDATE adk_blobs b
       SET refs = b.refs + c.n
      FROM (SELECT h, pg_catalog.count(DISTINCT e.seq) AS n
              FROM adk_events e, pg_catalog.unnest(e.blob_refs) h
             WHERE e.app_name = p_app_name AND e.user_id = p_user_id AND e.session_id = p_session_id
               AND e.session_day = p_day AND e.blob_refs IS NOT NULL
             GROUP BY h ORDER BY h) c
     WHERE b.app_name = p_app_name AND b.sha256 = c.h;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_hold_copied_blobs(p_app_name text, p_user_id text, p_session_id text, p_day date) FROM PUBLIC;

-- An event no longer names `p_refs` (it left, or its content was redacted):
-- each of those blobs loses a reference, and one with none left goes. The
-- DELETE runs first and only on a blob this event held the last reference
-- to; a concurrent release of the same blob waits for the row and sees the
-- count the other left, so two releases never both miss the last
-- reference. An append that shares the blob and finds it deleted stores it
-- anew (ON CONFLICT sees the row gone).
CREATE OR REPLACE FUNCTION adk_release_blob_refs(p_app_name text, p_refs bytea[]) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
BEGIN
    DELETE FROM adk_blobs b
     WHERE b.app_name = p_app_name AND b.sha256 = ANY (p_refs) AND b.refs <= 1;
    UPDATE adk_blobs b
       SET refs = b.refs - 1
     WHERE b.app_name = p_app_name AND b.sha256 = ANY (p_refs);
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_release_blob_refs(p_app_name text, p_refs bytea[]) FROM PUBLIC;

-- The trigger of every way an event leaves.
CREATE OR REPLACE FUNCTION adk_release_blobs() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, :"store_schema", pg_temp
AS $$
BEGIN
    PERFORM adk_release_blob_refs(OLD.app_name, OLD.blob_refs);
    RETURN NULL;
END;
$$;
REVOKE EXECUTE ON FUNCTION adk_release_blobs() FROM PUBLIC;
-- On the log itself, so no way an event leaves can skip it. A trigger on
-- the partitioned table is cloned to every partition, present and future.
-- Citus refuses a new trigger on a distributed table, and there no event
-- names a blob (append.sql refuses media it would have to move): the
-- trigger is made where adk_events is not distributed (yet).
DO $$
DECLARE
    distributed boolean := false;
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = $1)'
           INTO distributed USING 'adk_events'::regclass;
    END IF;
    IF NOT distributed THEN
        CREATE OR REPLACE TRIGGER adk_events_release_blobs AFTER DELETE ON adk_events
            FOR EACH ROW WHEN (OLD.blob_refs IS NOT NULL) EXECUTE FUNCTION adk_release_blobs();
    END IF;
END $$;

-- A role that may read sessions may read their media.
SELECT adk_grant_like('adk_get_blobs(text, text, text, text, bytea[])', 'adk_get_session(text, text, text, text, bigint, bigint)');
