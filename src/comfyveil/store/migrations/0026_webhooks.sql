-- comfyveil schema: signed webhooks of the API, and their durable outbox.
--
-- An account registers endpoints; each has its secret (the whsec_ form of the Standard
-- Webhooks scheme). The secret signs, so it is kept as it is, like the web's own secrets.
-- `busy_until` holds one delivery in flight per endpoint, whichever process sends it.
CREATE TABLE web_webhooks (
    id          bigserial PRIMARY KEY,
    account_id  bigint NOT NULL REFERENCES web_accounts (id) ON DELETE CASCADE,
    url         text NOT NULL,
    secret      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    busy_until  timestamptz
);
CREATE INDEX web_webhooks_account_idx ON web_webhooks (account_id);

-- One row per event and endpoint, written in the transaction that ended the job (or by
-- an explicit call for other jobs): nothing is lost to a process that stops meanwhile.
-- The payload holds ids and states only, never a prompt.
CREATE TABLE webhook_deliveries (
    id            bigserial PRIMARY KEY,
    webhook_id    bigint NOT NULL REFERENCES web_webhooks (id) ON DELETE CASCADE,
    message_id    text NOT NULL,
    payload       jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    next_at       timestamptz NOT NULL DEFAULT now(),
    attempts      integer NOT NULL DEFAULT 0,
    last_status   integer,
    delivered_at  timestamptz,
    given_up_at   timestamptz,
    CONSTRAINT webhook_deliveries_once UNIQUE (webhook_id, message_id)
);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (webhook_id, next_at, id)
    WHERE delivered_at IS NULL AND given_up_at IS NULL;

-- Jobs of other front ends whose end is told by webhook too (an images request whose
-- client went away: `WebhookStore.watch`).
CREATE TABLE webhook_jobs (
    job_id  uuid PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE
);

-- The events of one finished job for every endpoint of its owner's account; each once.
CREATE FUNCTION comfyveil_queue_webhooks(target uuid) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    queued integer;
BEGIN
    WITH job AS (
        SELECT j.id, j.user_id, j.command, j.status, j.finished_at
        FROM jobs j
        WHERE j.id = target AND j.status IN ('succeeded', 'failed', 'cancelled')
    ), inserted AS (
        INSERT INTO webhook_deliveries (webhook_id, message_id, payload)
        SELECT w.id,
               'msg_' || replace(job.id::text, '-', '') || '_' || job.status::text,
               jsonb_build_object(
                   'object', 'event',
                   'id', 'evt_' || replace(job.id::text, '-', '') || '_' || job.status::text,
                   'type', 'job.' || job.status::text,
                   'created_at', floor(extract(epoch FROM coalesce(job.finished_at, now()))),
                   'data', jsonb_build_object('id', job.id, 'object', 'job',
                                              'command', job.command,
                                              'state', job.status::text))
        FROM job
        JOIN web_accounts a ON a.user_id = job.user_id
        JOIN web_webhooks w ON w.account_id = a.id
        ON CONFLICT ON CONSTRAINT webhook_deliveries_once DO NOTHING
        RETURNING 1
    )
    SELECT count(*) INTO queued FROM inserted;
    IF queued > 0 THEN
        PERFORM pg_notify('comfyveil_webhooks', '');
    END IF;
    RETURN queued;
END;
$$;

-- A job of the jobs API (its key says so), or one watched, that ends queues its events in
-- the same transaction.
CREATE FUNCTION comfyveil_job_ended_webhooks() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IN ('succeeded', 'failed', 'cancelled') AND (
        EXISTS (SELECT 1 FROM jobs WHERE id = NEW.job_id AND idempotency_key LIKE 'apijob:%')
        OR EXISTS (SELECT 1 FROM webhook_jobs WHERE job_id = NEW.job_id)
    ) THEN
        PERFORM comfyveil_queue_webhooks(NEW.job_id);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER job_events_webhooks
    AFTER INSERT ON job_events
    FOR EACH ROW EXECUTE FUNCTION comfyveil_job_ended_webhooks();
