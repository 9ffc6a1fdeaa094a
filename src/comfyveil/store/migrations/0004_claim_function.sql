-- comfyveil schema, version 4: the claim keeps one query plan per connection.
--
-- Planning the claim (a recursive walk over waiting users, a lateral join, and five
-- data-modifying CTEs) takes about as long as running it, around 1 ms. As a prepared
-- statement it was re-planned on every call anyway: plan_cache_mode=auto keeps custom
-- plans when the generic one's estimate is higher, and an unknown LIMIT makes it so.
-- Inside a PL/pgSQL function the plan is cached per connection, and pinning
-- force_generic_plan makes it planned once. benchmarks/queue_throughput.py measures it.
--
-- The order it implements: highest priority, then the user whose last turn is oldest,
-- then the oldest job; see claim_job in queries.sql. p_per_user bounds how many ready jobs
-- of each user are looked at; when none of those was free it looks at all (NULL).
CREATE FUNCTION comfyveil_claim_job(
    p_worker_id text, p_backends text[], p_lease_seconds double precision, p_per_user int
) RETURNS SETOF jobs
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH RECURSIVE waiting (user_id) AS (
        (SELECT user_id FROM jobs WHERE status = 'queued' ORDER BY user_id LIMIT 1)
        UNION ALL
        SELECT (SELECT j.user_id FROM jobs j
                WHERE j.status = 'queued' AND j.user_id > w.user_id
                ORDER BY j.user_id LIMIT 1)
        FROM waiting w
        WHERE w.user_id IS NOT NULL
    ), candidate AS (
        SELECT j.id
        FROM (
            SELECT r.id, r.priority, t.turn, r.created_at
            FROM waiting w
            CROSS JOIN LATERAL (
                SELECT q.id, q.priority, q.created_at
                FROM jobs q
                WHERE q.status = 'queued' AND q.user_id = w.user_id
                  AND (q.not_before IS NULL OR q.not_before <= now())
                  AND (p_backends::text[] IS NULL OR q.backends IS NULL
                       OR q.backends && p_backends::text[])
                ORDER BY q.priority DESC, q.created_at, q.id
                LIMIT p_per_user
            ) r
            LEFT JOIN queue_turns t ON t.user_id = w.user_id
            ORDER BY r.priority DESC, t.turn ASC NULLS FIRST, r.created_at, r.id
        ) c
        CROSS JOIN LATERAL (  -- locks candidates one at a time, in order, until one is free
            SELECT l.id FROM jobs l WHERE l.id = c.id AND l.status = 'queued'
            FOR UPDATE SKIP LOCKED
        ) j
        ORDER BY c.priority DESC, c.turn ASC NULLS FIRST, c.created_at, c.id
        LIMIT 1
    ), claimed AS (
        UPDATE jobs j
        SET status = 'running',
            attempts = j.attempts + 1,
            lease_owner = p_worker_id,
            lease_expires_at = now() + make_interval(secs => p_lease_seconds),
            started_at = now(),
            updated_at = now()
        FROM candidate c
        WHERE j.id = c.id
        RETURNING j.*
    ), turn_held AS (
        -- A user's turn row locked by a claim racing this one is skipped, not waited for: that
        -- claim is moving the user to the back already, and waiting would serialise workers.
        SELECT t.user_id FROM queue_turns t
        WHERE t.user_id = (SELECT user_id FROM claimed)
        FOR UPDATE SKIP LOCKED
    ), turn_moved AS (
        UPDATE queue_turns t SET turn = nextval('queue_turn_seq')
        FROM turn_held h
        WHERE t.user_id = h.user_id
    ), turn_first AS (
        INSERT INTO queue_turns (user_id, turn)
        SELECT user_id, nextval('queue_turn_seq') FROM claimed c
        WHERE NOT EXISTS (SELECT 1 FROM queue_turns t WHERE t.user_id = c.user_id)
        ON CONFLICT (user_id) DO UPDATE SET turn = excluded.turn
    ), event AS (
        INSERT INTO job_events (job_id, kind, status, data)
        SELECT id, 'claimed', status,
               jsonb_build_object('worker', lease_owner, 'attempt', attempts, 'submitted', submitted,
                                  'backend', backend)
        FROM claimed
    )
    SELECT * FROM claimed;
    IF NOT FOUND AND p_per_user IS NOT NULL THEN
        -- Each user's first few ready jobs were all being claimed by other workers, or the
        -- queue is empty (then this is cheap): look at every ready job, in the same call.
        RETURN QUERY
        SELECT * FROM comfyveil_claim_job(p_worker_id, p_backends, p_lease_seconds, NULL);
    END IF;
END;
$$;
