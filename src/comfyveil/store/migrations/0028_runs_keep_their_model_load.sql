-- comfyveil schema, version 28: a finished run keeps whether it loaded models, and for how long.
--
-- The ETA learns what runs cost from the runs the database holds; the pool learns from
-- ComfyUI's own timings (which loaders ran, and their seconds). Without them in the
-- database the ETA took a backend's first run, or one after ComfyUI dropped its models,
-- for a slow warm run, and its estimates rose, then fell, as that run left its window.
-- Completing a job now merges what its run measured (`p_run`: "cold", "load_s") into its
-- progress. The statement is version 6's, plus that merge; the version 6 call (a worker
-- not yet upgraded) goes through it with nothing measured.
CREATE FUNCTION comfyveil_complete_job(
    p_job_id uuid, p_worker_id text, p_filenames text[], p_kinds text[], p_mimes text[],
    p_datas bytea[], p_refs jsonb, p_sinks text[], p_claim_seconds double precision,
    p_run jsonb
) RETURNS SETOF jobs
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH updated AS (
        UPDATE jobs
        SET status = 'succeeded', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL,
            error = NULL, updated_at = now(),
            progress = CASE WHEN p_run IS NULL OR p_run = '{}'::jsonb THEN progress
                            ELSE coalesce(progress, '{}'::jsonb) || p_run END
        WHERE id = p_job_id AND status = 'running' AND lease_owner = p_worker_id
        RETURNING *
    ), event AS (
        INSERT INTO job_events (job_id, kind, status, data)
        SELECT id, 'succeeded', status,
               jsonb_build_object('outputs', cardinality(p_filenames))
        FROM updated
    ), stored AS (
        INSERT INTO job_outputs (job_id, index, filename, kind, mime, data, size)
        SELECT u.id, o.index - 1, o.filename, o.kind, o.mime, o.data, length(o.data)
        FROM updated u,
             unnest(p_filenames, p_kinds, p_mimes, p_datas)
                 WITH ORDINALITY AS o (filename, kind, mime, data, index)
    ), chained AS (
        INSERT INTO chat_sessions (chat_id, user_id, job_id, outputs)
        SELECT u.chat_id, u.user_id, u.id, p_refs
        FROM updated u
        WHERE cardinality(p_filenames) > 0
        ON CONFLICT (chat_id) DO UPDATE
        SET user_id = excluded.user_id, job_id = excluded.job_id, outputs = excluded.outputs,
            updated_at = now()
    ), claimed AS (
        -- as claim_delivery; the job ends only now, so no one can have delivered it yet
        INSERT INTO delivery_claims (job_id, sink, claimed_by, claimed_until)
        SELECT u.id, s.sink, p_worker_id, now() + make_interval(secs => p_claim_seconds)
        FROM updated u, unnest(p_sinks) AS s (sink)
        ON CONFLICT (job_id, sink) DO UPDATE
        SET claimed_by = excluded.claimed_by, claimed_until = excluded.claimed_until
        WHERE delivery_claims.claimed_until < now()
    )
    SELECT * FROM updated;
END;
$$;

CREATE OR REPLACE FUNCTION comfyveil_complete_job(
    p_job_id uuid, p_worker_id text, p_filenames text[], p_kinds text[], p_mimes text[],
    p_datas bytea[], p_refs jsonb, p_sinks text[], p_claim_seconds double precision
) RETURNS SETOF jobs
LANGUAGE sql
AS $$
    SELECT * FROM comfyveil_complete_job(
        p_job_id, p_worker_id, p_filenames, p_kinds, p_mimes, p_datas, p_refs, p_sinks,
        p_claim_seconds, '{}'::jsonb
    );
$$;
