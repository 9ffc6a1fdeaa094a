-- comfyveil schema, version 1: users, chat sessions, commands, the job queue.

CREATE TYPE job_status AS ENUM ('queued', 'running', 'succeeded', 'failed', 'cancelled');

CREATE TABLE users (
    id          bigint PRIMARY KEY,                        -- Telegram user id
    role        text NOT NULL DEFAULT 'user'
                CONSTRAINT users_role_check CHECK (role IN ('user', 'admin', 'banned')),
    settings    jsonb NOT NULL DEFAULT '{}'::jsonb,
    daily_quota integer CONSTRAINT users_daily_quota_check CHECK (daily_quota >= 0),  -- NULL: the configured default
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE commands (
    command       text PRIMARY KEY,                        -- without the slash: "f", "qwen"
    workflow      text NOT NULL,
    title         text NOT NULL,
    description   text NOT NULL DEFAULT '',
    kind          text NOT NULL,
    toml          text NOT NULL,                           -- bindings, as written
    graph         text NOT NULL,                           -- API-format graph JSON, as written
    enabled       boolean NOT NULL DEFAULT true,
    allowed_roles text[] NOT NULL DEFAULT ARRAY['user', 'admin'],
    limits        jsonb NOT NULL DEFAULT '{}'::jsonb,
    hash          text NOT NULL,
    source        text NOT NULL
                  CONSTRAINT commands_source_check CHECK (source IN ('shipped', 'operator')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE jobs (
    id                uuid PRIMARY KEY,                    -- also ComfyUI's prompt_id
    idempotency_key   text CONSTRAINT jobs_idempotency_key_key UNIQUE,
    user_id           bigint NOT NULL,
    chat_id           bigint NOT NULL,
    command           text NOT NULL,
    workflow_hash     text NOT NULL,
    params            jsonb NOT NULL DEFAULT '{}'::jsonb,  -- validated parameter values
    backends          text[],                              -- backends able to run it; NULL: any
    status            job_status NOT NULL DEFAULT 'queued',
    submitted         boolean NOT NULL DEFAULT false,      -- a backend accepted the prompt
    backend           text,
    attempts          integer NOT NULL DEFAULT 0,
    max_attempts      integer NOT NULL DEFAULT 3 CONSTRAINT jobs_max_attempts_check CHECK (max_attempts >= 1),
    priority          integer NOT NULL DEFAULT 0,          -- higher runs first
    lease_owner       text,
    lease_expires_at  timestamptz,
    not_before        timestamptz,                         -- retry backoff
    cancel_requested  boolean NOT NULL DEFAULT false,
    error             text,
    status_message_id bigint,                              -- Telegram message showing progress
    progress          jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at        timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    finished_at       timestamptz,
    updated_at        timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX jobs_queued_idx ON jobs (priority DESC, created_at, id) WHERE status = 'queued';
CREATE INDEX jobs_running_lease_idx ON jobs (lease_expires_at) WHERE status = 'running';
CREATE INDEX jobs_user_idx ON jobs (user_id, created_at DESC);
CREATE INDEX jobs_finished_idx ON jobs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_duration_idx ON jobs (command, backend, finished_at DESC) WHERE status = 'succeeded';

-- Input images stay only until the job ends.
CREATE TABLE job_inputs (
    job_id   uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    index    integer NOT NULL,
    filename text NOT NULL,
    mime     text NOT NULL,
    data     bytea NOT NULL,
    PRIMARY KEY (job_id, index)
);

CREATE TABLE job_outputs (
    job_id   uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    index    integer NOT NULL,
    filename text NOT NULL,
    kind     text NOT NULL,                                -- image, video, audio, ...
    mime     text NOT NULL,
    data     bytea NOT NULL,
    size     bigint NOT NULL,
    PRIMARY KEY (job_id, index)
);

-- Append-only history; every insert is announced on comfyveil_job_updates.
CREATE TABLE job_events (
    id     bigserial PRIMARY KEY,
    job_id uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind   text NOT NULL,
    status job_status NOT NULL,
    data   jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX job_events_job_idx ON job_events (job_id, id);

-- A result goes to each sink at most once.
CREATE TABLE deliveries (
    job_id       uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    sink         text NOT NULL,
    delivered_at timestamptz NOT NULL DEFAULT now(),
    detail       jsonb NOT NULL DEFAULT '{}'::jsonb,
    PRIMARY KEY (job_id, sink)
);

-- The last result in each chat, for chaining ("/qwen make it night" edits it).
CREATE TABLE chat_sessions (
    chat_id    bigint PRIMARY KEY,
    user_id    bigint NOT NULL,
    job_id     uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    outputs    jsonb NOT NULL DEFAULT '[]'::jsonb,         -- [{index, filename, kind, mime}]
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX chat_sessions_user_idx ON chat_sessions (user_id);

-- Round-robin between users: the user whose last claim is oldest goes next.
CREATE SEQUENCE queue_turn_seq;
CREATE TABLE queue_turns (
    user_id bigint PRIMARY KEY,
    turn    bigint NOT NULL
);

CREATE FUNCTION comfyveil_notify_job_event() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(
        'comfyveil_job_updates',
        json_build_object('job_id', NEW.job_id, 'event', NEW.kind, 'status', NEW.status)::text
    );
    IF NEW.status = 'queued' THEN
        PERFORM pg_notify('comfyveil_jobs', json_build_object('job_id', NEW.job_id)::text);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER job_events_notify
    AFTER INSERT ON job_events
    FOR EACH ROW EXECUTE FUNCTION comfyveil_notify_job_event();
