-- comfyveil schema: the images API's requests, so a client's retry attaches to the jobs
-- its first try queued, and jobs nobody waits for any more are given up.
--
-- OpenAI's SDK retries a request that timed out or lost its connection with the same
-- body and no Idempotency-Key. A request without a key is remembered here by a digest of
-- its account and body (never the prompt itself) with the jobs it queued. While a client
-- waits (`clients` > 0) the row is its own: a second identical request that is alive
-- is a second request. When its last client goes, `left_at` is set; a retry within the
-- grace period (or later, while its started jobs are kept) takes the row over instead of
-- queueing again. A row nobody took over within the grace period has its jobs that never
-- started cancelled (their quota comes back with the cancel, migration 0010); one whose
-- jobs all started is `kept` until a retry takes it or the keep period ends. The state
-- lives in the database, not in a process, as several web/API processes may serve one
-- database and a retry may reach another one.
CREATE TABLE api_requests (
    id           bigserial PRIMARY KEY,
    account_id   bigint NOT NULL REFERENCES web_accounts (id) ON DELETE CASCADE,
    fingerprint  bytea NOT NULL,          -- HMAC-SHA256 of the route, the account and the body
    job_ids      uuid[] NOT NULL,
    clients      integer NOT NULL DEFAULT 1,  -- requests waiting for these jobs now
    state        text NOT NULL DEFAULT 'open'
                 CHECK (state IN ('open', 'kept', 'handed', 'cancelled')),
    attached     integer NOT NULL DEFAULT 0,  -- retries that took the row over
    created_at   timestamptz NOT NULL DEFAULT now(),
    left_at      timestamptz              -- when its last client went; NULL while one waits
);
CREATE INDEX api_requests_retry_idx ON api_requests (account_id, fingerprint)
    WHERE state IN ('open', 'kept');
CREATE INDEX api_requests_left_idx ON api_requests (left_at)
    WHERE state IN ('open', 'kept') AND clients = 0;
