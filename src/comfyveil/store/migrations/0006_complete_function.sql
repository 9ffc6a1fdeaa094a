-- comfyveil schema, version 6: completing a job keeps one query plan per connection.
--
-- complete_job became one statement (the job, its event, its outputs, the chat's last
-- result and the delivery claims), and like the claim before it (version 4) PostgreSQL
-- re-planned it on every call: planning took 0.5 ms, running it 0.13 ms. In a PL/pgSQL
-- function with plan_cache_mode pinned to force_generic_plan it is planned once per
-- connection. The statement is the one complete_job in queries.sql had, unchanged.
CREATE FUNCTION comfyveil_complete_job(
    p_job_id uuid, p_worker_id text, p_filenames text[], p_kinds text[], p_mimes text[],
    p_datas bytea[], p_refs jsonb, p_sinks text[], p_claim_seconds double precision
) RETURNS SETOF jobs
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH updated AS (
        UPDATE jobs
        SET status = 'succeeded', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL,
            error = NULL, updated_at = now()
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
