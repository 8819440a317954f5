-- The whole data model of the store. Everything day-based is UTC: the
-- defaults below never read the server's TimeZone setting.

-- `app:` keys, prefix stripped, one row per app.
CREATE TABLE adk_app_states (
    app_name   text        NOT NULL,
    state      jsonb       NOT NULL DEFAULT '{}',
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT adk_app_states_pkey PRIMARY KEY (app_name),
    CONSTRAINT adk_app_states_app_name_sane CHECK (length(app_name) BETWEEN 1 AND 128),
    CONSTRAINT adk_app_states_state_is_object CHECK (jsonb_typeof(state) = 'object'),
    CONSTRAINT adk_app_states_state_size CHECK (pg_column_size(state) < 65536)
) WITH (fillfactor = 80);

-- `user:` keys, prefix stripped, one row per (app, user).
CREATE TABLE adk_user_states (
    app_name   text        NOT NULL,
    user_id    text        NOT NULL,
    state      jsonb       NOT NULL DEFAULT '{}',
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT adk_user_states_pkey PRIMARY KEY (app_name, user_id),
    CONSTRAINT adk_user_states_app_name_sane CHECK (length(app_name) BETWEEN 1 AND 128),
    CONSTRAINT adk_user_states_user_id_sane CHECK (length(user_id) BETWEEN 1 AND 128),
    CONSTRAINT adk_user_states_state_is_object CHECK (jsonb_typeof(state) = 'object'),
    CONSTRAINT adk_user_states_state_size CHECK (pg_column_size(state) < 65536)
) WITH (fillfactor = 80);

-- One row per session: identity, session-scoped state, the per-session mutex
-- (appends lock it to take the next seq) and listing metadata. Every append
-- updates last_seq, updated_at and sometimes state, so none of those is
-- indexed: the update stays HOT, and fillfactor 80 leaves room on the page.
CREATE TABLE adk_sessions (
    app_name     text        NOT NULL,
    user_id      text        NOT NULL,
    session_id   text        NOT NULL,
    state        jsonb       NOT NULL DEFAULT '{}',
    last_seq     bigint      NOT NULL DEFAULT 0,
    session_day  date        NOT NULL DEFAULT ((now() AT TIME ZONE 'UTC')::date),
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz,
    closed_at    timestamptz,
    successor_id text,
    CONSTRAINT adk_sessions_pkey PRIMARY KEY (app_name, user_id, session_id),
    CONSTRAINT adk_sessions_app_name_sane CHECK (length(app_name) BETWEEN 1 AND 128),
    CONSTRAINT adk_sessions_user_id_sane CHECK (length(user_id) BETWEEN 1 AND 128),
    CONSTRAINT adk_sessions_session_id_sane CHECK (length(session_id) BETWEEN 1 AND 128),
    CONSTRAINT adk_sessions_state_is_object CHECK (jsonb_typeof(state) = 'object'),
    CONSTRAINT adk_sessions_state_size CHECK (pg_column_size(state) < 65536),
    CONSTRAINT adk_sessions_last_seq_nonnegative CHECK (last_seq >= 0),
    CONSTRAINT adk_sessions_successor_sane CHECK (successor_id IS NULL OR closed_at IS NOT NULL)
) WITH (fillfactor = 80);

-- The events' foreign key targets this key, so a cascading delete carries
-- session_day and touches one partition instead of probing all of them.
-- session_day never changes after insert, so this index keeps appends HOT.
CREATE UNIQUE INDEX adk_sessions_key_day ON adk_sessions (app_name, user_id, session_id, session_day);
ALTER TABLE adk_sessions ADD CONSTRAINT adk_sessions_key_day UNIQUE USING INDEX adk_sessions_key_day;

-- Expiry scans and per-day retention deletes; neither column moves on append.
CREATE INDEX adk_sessions_expiry ON adk_sessions (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX adk_sessions_day ON adk_sessions (session_day);

-- The append-only event log, one partition per UTC session day and no
-- default partition: a write for a day without a partition fails loudly.
CREATE TABLE adk_events (
    app_name      text        NOT NULL,
    user_id       text        NOT NULL,
    session_id    text        NOT NULL,
    session_day   date        NOT NULL,
    seq           bigint      NOT NULL,
    event_id      text        NOT NULL,
    invocation_id text,
    author        text        NOT NULL,
    event_ts      bigint      NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    payload       jsonb       NOT NULL,
    CONSTRAINT adk_events_pkey PRIMARY KEY (app_name, user_id, session_id, session_day, seq),
    CONSTRAINT adk_events_event_id_key UNIQUE (app_name, user_id, session_id, session_day, event_id),
    CONSTRAINT adk_events_session_fkey FOREIGN KEY (app_name, user_id, session_id, session_day)
        REFERENCES adk_sessions (app_name, user_id, session_id, session_day) ON DELETE CASCADE,
    CONSTRAINT adk_events_seq_positive CHECK (seq > 0),
    CONSTRAINT adk_events_payload_is_object CHECK (jsonb_typeof(payload) = 'object')
) PARTITION BY RANGE (session_day);
