-- comfyveil schema, version 8: a user's limits outlive their data, and hold under races.
--
-- The daily quota was a count of the user's jobs, and /forget deletes those: "queue
-- three, /forget, repeat" went past every limit. The cooldown was kept in the bot's
-- memory and checked before the job was recorded, so two updates at once both passed.
-- Now a user's usage (jobs today, when the last one was queued) is a row of counters
-- with no content, which /forget keeps, and comfyveil_enqueue_job checks and records all
-- limits, the cooldown included, in one statement under the user's lock.
CREATE TABLE user_usage (
    user_id     bigint PRIMARY KEY,                    -- Telegram user id; nothing else
    day         date NOT NULL,                         -- the UTC day jobs_today counts
    jobs_today  integer NOT NULL DEFAULT 0,
    last_job_at timestamptz                            -- when the last job was queued
);

INSERT INTO user_usage (user_id, day, jobs_today, last_job_at)
SELECT user_id, (now() AT TIME ZONE 'UTC')::date,
       count(*) FILTER (
           WHERE created_at >= (date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')
       ),
       max(created_at)
FROM jobs
GROUP BY user_id;

-- Why a job of this user may not be queued now (refusal NULL: it may), and the figure
-- the refusal names: the limit, or the seconds left of the cooldown. Read-only, so the
-- bot asks it before downloading a user's image; the enqueue asks it again under the lock.
CREATE FUNCTION comfyveil_user_refusal(
    p_user_id bigint, p_max_active int, p_daily_quota int, p_cooldown float8,
    OUT refusal text, OUT refusal_limit int
)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_active bigint;
    v_today int;
    v_last timestamptz;
    v_quota int;
BEGIN
    SELECT count(*) INTO v_active
    FROM jobs j WHERE j.user_id = p_user_id AND j.status IN ('queued', 'running');
    SELECT CASE WHEN u.day = (now() AT TIME ZONE 'UTC')::date THEN u.jobs_today ELSE 0 END,
           u.last_job_at
    INTO v_today, v_last
    FROM user_usage u WHERE u.user_id = p_user_id;
    SELECT u.daily_quota INTO v_quota FROM users u WHERE u.id = p_user_id;
    v_quota := coalesce(v_quota, p_daily_quota);  -- a per-user quota wins
    IF p_max_active IS NOT NULL AND v_active >= p_max_active THEN
        refusal := 'queue_limit';
        refusal_limit := p_max_active;
    ELSIF v_quota IS NOT NULL AND coalesce(v_today, 0) >= v_quota THEN
        refusal := 'daily_quota';
        refusal_limit := v_quota;
    ELSIF p_cooldown > 0 AND v_last IS NOT NULL
          AND v_last > now() - make_interval(secs => p_cooldown) THEN
        refusal := 'cooldown';
        refusal_limit := greatest(ceil(extract(epoch FROM
            v_last + make_interval(secs => p_cooldown) - now())), 1)::int;
    END IF;
END;
$$;

DROP FUNCTION comfyveil_enqueue_job(
    uuid, text, bigint, bigint, text, text, jsonb, text[], int, int, bigint, int, int
);

CREATE FUNCTION comfyveil_enqueue_job(
    p_id uuid, p_idempotency_key text, p_user_id bigint, p_chat_id bigint, p_command text,
    p_workflow_hash text, p_params jsonb, p_backends text[], p_max_attempts int,
    p_priority int, p_status_message_id bigint, p_max_active int, p_daily_quota int,
    p_cooldown float8
) RETURNS TABLE (refusal text, refusal_limit int, created boolean, job_row jobs)
LANGUAGE plpgsql
AS $$
BEGIN
    created := false;
    -- Serialise enqueues of one user so the per-user limits cannot be raced past.
    PERFORM pg_advisory_xact_lock(1129270860, hashtext(p_user_id::text));
    IF p_idempotency_key IS NOT NULL THEN
        SELECT j.* INTO job_row FROM jobs j WHERE j.idempotency_key = p_idempotency_key;
        IF FOUND THEN
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;

    SELECT r.refusal, r.refusal_limit INTO refusal, refusal_limit
    FROM comfyveil_user_refusal(p_user_id, p_max_active, p_daily_quota, p_cooldown) r;
    IF refusal IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;

    INSERT INTO jobs (id, idempotency_key, user_id, chat_id, command, workflow_hash, params,
                      backends, max_attempts, priority, status_message_id)
    VALUES (p_id, p_idempotency_key, p_user_id, p_chat_id, p_command, p_workflow_hash,
            p_params, p_backends, p_max_attempts, p_priority, p_status_message_id)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING * INTO job_row;
    IF NOT FOUND THEN  -- another user's transaction took the key meanwhile
        SELECT j.* INTO job_row FROM jobs j WHERE j.idempotency_key = p_idempotency_key;
        IF NOT FOUND THEN
            refusal := 'retry';
        END IF;
        RETURN NEXT;
        RETURN;
    END IF;
    INSERT INTO user_usage AS u (user_id, day, jobs_today, last_job_at)
    VALUES (p_user_id, (now() AT TIME ZONE 'UTC')::date, 1, now())
    ON CONFLICT (user_id) DO UPDATE
    SET jobs_today = CASE WHEN u.day = excluded.day THEN u.jobs_today + 1 ELSE 1 END,
        day = excluded.day, last_job_at = excluded.last_job_at;
    INSERT INTO job_events (job_id, kind, status, data)
    VALUES (job_row.id, 'queued', job_row.status,
            jsonb_build_object('command', job_row.command));
    created := true;
    RETURN NEXT;
END;
$$;

-- The exact workflow of a job that no command holds: `comfyveil submit path/NAME.toml`
-- queues a graph and bindings of the submitter's own, and a worker on another host must
-- run that graph, not whatever a command of the same name holds. Keyed by the workflow's
-- content hash, which every job carries (jobs.workflow_hash).
CREATE TABLE workflow_versions (
    hash       text PRIMARY KEY,
    workflow   text NOT NULL,                           -- NAME of NAME.toml
    toml       text NOT NULL,                           -- bindings, as written
    graph      text NOT NULL,                           -- API-format graph JSON, as written
    created_at timestamptz NOT NULL DEFAULT now()
);
