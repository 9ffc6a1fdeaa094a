-- comfyveil schema, version 9: the hot read queries read no more as history grows.
--
-- Finished jobs stay until the retention purge. With 200 000 of them, position_and_eta
-- (run for every tracked job on every change of the queue) took 100 ms and more,
-- command_durations 66 ms and undelivered_jobs 108 ms, each a sequential scan of jobs.
-- benchmarks/queries_at_scale.py measures them against an empty table.

-- The last runs of one command, newest first: an ETA reads 20 entries of it per command,
-- from the index alone (per backend, jobs_duration_idx of version 1 does the same).
CREATE INDEX jobs_recent_runs_idx ON jobs (command, finished_at DESC) INCLUDE (started_at)
    WHERE status = 'succeeded' AND started_at IS NOT NULL;

-- The sinks a finished job reached, as a sorted array beside the job, kept by a trigger
-- on deliveries. A deployment has a handful of sinks, so finished jobs fall into a few
-- groups of equal arrays; a sink's catch-up reads, in finished order, only the groups
-- whose array lacks it (a few index probes), never the jobs it already delivered.
ALTER TABLE jobs ADD COLUMN delivered_to text[] NOT NULL DEFAULT '{}';

UPDATE jobs j SET delivered_to = d.sinks
FROM (SELECT job_id, array_agg(sink ORDER BY sink) AS sinks FROM deliveries GROUP BY job_id) d
WHERE d.job_id = j.id;

CREATE INDEX jobs_delivery_idx ON jobs (delivered_to, finished_at, id)
    WHERE status IN ('succeeded', 'failed', 'cancelled');

CREATE FUNCTION comfyveil_note_delivery() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE jobs
    SET delivered_to = ARRAY(SELECT d.sink FROM deliveries d
                             WHERE d.job_id = NEW.job_id ORDER BY d.sink)
    WHERE id = NEW.job_id;
    RETURN NULL;
END;
$$;

CREATE TRIGGER deliveries_note
    AFTER INSERT ON deliveries
    FOR EACH ROW EXECUTE FUNCTION comfyveil_note_delivery();

-- A sink's catch-up: finished jobs whose result has not reached `p_sink`, oldest first.
-- The few arrays of sinks in use are found by a loose scan of jobs_delivery_idx; only the
-- groups that lack this sink are read, in finished order. Planning it against the
-- statistics of a large history cost more than running it (the arrays' statistics), so
-- like the claim (version 4) it lives in a function whose plan is made once per
-- connection.
CREATE FUNCTION comfyveil_undelivered_jobs(p_sink text, p_limit int) RETURNS SETOF jobs
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH RECURSIVE reached AS (
        SELECT (SELECT min(delivered_to) FROM jobs
                WHERE status IN ('succeeded', 'failed', 'cancelled')) AS sinks
        UNION ALL
        SELECT (SELECT min(j.delivered_to) FROM jobs j
                WHERE j.status IN ('succeeded', 'failed', 'cancelled')
                  AND j.delivered_to > g.sinks)
        FROM reached g
        WHERE g.sinks IS NOT NULL
    )
    SELECT w.* FROM reached g
    CROSS JOIN LATERAL (
        SELECT j.* FROM jobs j
        WHERE j.status IN ('succeeded', 'failed', 'cancelled') AND j.delivered_to = g.sinks
        ORDER BY j.finished_at, j.id
        LIMIT p_limit
    ) w
    WHERE g.sinks IS NOT NULL AND NOT (p_sink = ANY (g.sinks))
    ORDER BY w.finished_at, w.id
    LIMIT p_limit;
END;
$$;
