-- comfyveil schema, version 12: a result that cannot be delivered ends, and never blocks.
--
-- A delivery that fails (the chat is gone, the bot was blocked) used to leave the job
-- undelivered for good: the catch-up read the same oldest jobs again and again and never
-- reached the ones behind them. Each failed try is now counted on the delivery's claim,
-- whose expiry holds the next try back (with a growing delay); after a bounded number of
-- tries the delivery is recorded with the outcome `failed`. A sink that does not take a
-- job at all (the Telegram sink and a job queued by `comfyveil submit`) records `skipped`.
-- Either outcome is a row in deliveries, so the job leaves the sink's catch-up for good.
ALTER TABLE delivery_claims ADD COLUMN failures integer NOT NULL DEFAULT 0;
ALTER TABLE delivery_claims ADD COLUMN last_error text;
ALTER TABLE deliveries ADD COLUMN outcome text NOT NULL DEFAULT 'delivered'
    CONSTRAINT deliveries_outcome_check CHECK (outcome IN ('delivered', 'failed', 'skipped'));

-- The catch-up of version 9, leaving out the jobs whose delivery to this sink is claimed:
-- being made right now, or waiting out the delay after a failed try.
CREATE OR REPLACE FUNCTION comfyveil_undelivered_jobs(p_sink text, p_limit int)
RETURNS SETOF jobs
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
          AND NOT EXISTS (SELECT 1 FROM delivery_claims c
                          WHERE c.job_id = j.id AND c.sink = p_sink
                            AND c.claimed_until > now())
        ORDER BY j.finished_at, j.id
        LIMIT p_limit
    ) w
    WHERE g.sinks IS NOT NULL AND NOT (p_sink = ANY (g.sinks))
    ORDER BY w.finished_at, w.id
    LIMIT p_limit;
END;
$$;
