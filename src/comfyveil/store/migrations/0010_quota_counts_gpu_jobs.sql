-- comfyveil schema, version 10: only jobs that reached a GPU count toward the daily quota.
--
-- Every queued job took one of the day's jobs (user_usage.jobs_today, version 8), so a
-- refusal cost quota: a /f refused at once (no GPU has its model) or failed because a
-- backend died used one up. A job now gives its count back, once (`quota_refunded`),
-- when it ends without having been submitted to a backend (refused, cancelled while it
-- waited), or when the worker says it failed through no fault of its user (a backend
-- that went away, a model found missing only when the prompt was posted: the
-- refund_quota query). The count comes off the day the job was queued on, so a refund
-- after midnight does not lend the new day a job. Jobs /forget deletes are not given
-- back (deleting is not ending), as the counters are meant to outlive /forget.
ALTER TABLE jobs ADD COLUMN quota_refunded boolean NOT NULL DEFAULT false;

CREATE FUNCTION comfyveil_quota_refund() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT OLD.quota_refunded AND NOT NEW.submitted
       AND NEW.status IN ('failed', 'cancelled') AND OLD.status IN ('queued', 'running') THEN
        NEW.quota_refunded := true;
    END IF;
    IF NEW.quota_refunded AND NOT OLD.quota_refunded THEN
        UPDATE user_usage
        SET jobs_today = greatest(jobs_today - 1, 0)
        WHERE user_id = NEW.user_id AND day = (NEW.created_at AT TIME ZONE 'UTC')::date;
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER jobs_quota_refund
    BEFORE UPDATE OF status, quota_refunded ON jobs
    FOR EACH ROW EXECUTE FUNCTION comfyveil_quota_refund();
