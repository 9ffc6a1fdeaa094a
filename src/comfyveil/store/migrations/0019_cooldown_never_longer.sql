-- comfyveil schema: a cooldown refusal never names more seconds than the cooldown.
--
-- Two enqueues of one user in flight together: the one that waited on the user's lock
-- started its transaction (its now()) before the admitted one stamped last_job_at, so
-- "seconds left" came out as the cooldown plus that wait ("wait 31 seconds" for a cooldown
-- of 30). The figure is now capped at the cooldown itself.
CREATE OR REPLACE FUNCTION comfyveil_user_refusal(
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
        refusal_limit := least(greatest(ceil(extract(epoch FROM
            v_last + make_interval(secs => p_cooldown) - now())), 1),
            greatest(ceil(p_cooldown), 1))::int;
    END IF;
END;
$$;
