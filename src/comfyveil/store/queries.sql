-- Every query comfyveil runs. A query starts with `-- name --` and a description line;
-- the Python method that runs it has the same name. Parameters are %(name)s.
--
-- Commits wait for the disk, except those of a job's own bookkeeping while it runs: the
-- claim, its lease, its progress. Those set synchronous_commit off for their own
-- transaction (`relaxed` below). The record of the backend a job went to (mark_submitted)
-- waits for the disk, and it is written before the prompt is posted: a crash of PostgreSQL
-- itself (`pg_ctl stop -m immediate`) can then undo a claim only for a job that was never
-- sent, and no job is sent twice. Queueing a job, its result and its delivery always wait
-- for the disk.

-- enqueue_job --
-- Queue a job unless the user's limits refuse it (checked and recorded in this one
-- statement, under the user's lock: migration 0008); with an idempotency key already used,
-- that job. Columns: refusal, refusal_limit, created, then the job's (all NULL when refused)
SELECT e.refusal, e.refusal_limit, e.created, (e.job_row).*
FROM comfyveil_enqueue_job(
    %(id)s::uuid, %(idempotency_key)s::text, %(user_id)s::bigint, %(chat_id)s::bigint,
    %(command)s::text, %(workflow_hash)s::text, %(params)s::jsonb, %(backends)s::text[],
    %(max_attempts)s::int, %(priority)s::int, %(status_message_id)s::bigint,
    %(max_active)s::int, %(daily_quota)s::int, %(cooldown)s::float8
) e;

-- user_refusal --
-- Whether the user's limits would refuse a job now, without queueing one (before the bot
-- downloads an image); enqueue_job asks the same again under the user's lock
SELECT r.refusal, r.refusal_limit
FROM comfyveil_user_refusal(
    %(user_id)s::bigint, %(max_active)s::int, %(daily_quota)s::int, %(cooldown)s::float8
) r;

-- insert_job_input --
-- Keep one input image of a job until the job ends
INSERT INTO job_inputs (job_id, index, filename, mime, data)
VALUES (%(job_id)s, %(index)s, %(filename)s, %(mime)s, %(data)s);

-- claim_job --
-- Take the next job: highest priority, then the user whose last turn is oldest, then oldest job
-- The order is that of ORDER BY priority DESC, turn NULLS FIRST, created_at, id over all ready
-- jobs, found without reading them all: a user's first ready job is the only one of theirs
-- that can come first, so only the users with queued jobs (a loose index scan) and the first
-- %(per_user)s ready jobs of each (more than one, to step past rows other workers are
-- claiming right now) are sorted; when none of those is free, every ready job is read.
SELECT claimed.*
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed,
     comfyveil_claim_job(
         %(worker_id)s, %(backends)s::text[], %(lease_seconds)s, %(per_user)s::int
     ) AS claimed;

-- renew_lease --
-- Extend the lease of a job this worker holds
WITH relaxed AS (
    SELECT set_config('synchronous_commit', 'off', true)
)
UPDATE jobs
SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s), updated_at = now()
FROM relaxed
WHERE id = %(job_id)s AND status = 'running' AND lease_owner = %(worker_id)s
RETURNING jobs.*;

-- mark_submitted --
-- Record the backend the job's prompt is about to be posted to, unless a cancel was asked
-- for (a job cancelled before this is never sent); durable, see the top of this file
WITH updated AS (
    UPDATE jobs
    SET submitted = true, backend = %(backend)s, executing_at = NULL, updated_at = now()
    WHERE id = %(job_id)s AND status = 'running' AND lease_owner = %(worker_id)s
      AND NOT cancel_requested
    RETURNING jobs.*
), event AS (
    INSERT INTO job_events (job_id, kind, status, data)
    SELECT id, 'submitted', status, jsonb_build_object('backend', backend) FROM updated
)
SELECT * FROM updated;

-- record_progress --
-- Store the latest progress of a running job and tell listeners (no event row); once
-- ComfyUI started the prompt (executing_for: seconds ago, by the worker's clock), when it
-- did, unless known already (a worker re-attached to a prompt running since)
WITH relaxed AS (
    SELECT set_config('synchronous_commit', 'off', true)
), updated AS (
    UPDATE jobs
    SET progress = %(progress)s, updated_at = now(),
        executing_at = coalesce(
            executing_at,
            now() - make_interval(secs => %(executing_for)s::float8)
        )
    FROM relaxed
    WHERE id = %(job_id)s AND status = 'running' AND lease_owner = %(worker_id)s
    RETURNING id, status, cancel_requested
)
SELECT cancel_requested,
       pg_notify('comfyveil_job_updates',
                 json_build_object('job_id', id, 'event', 'progress', 'status', status)::text)
FROM updated;

-- complete_job --
-- Mark a running job succeeded, store its outputs, make them the chat's last result and
-- claim its delivery to the worker's sinks, in one statement (one round trip, all or
-- nothing; the statement is in migration 0028), and keep in its progress what its run
-- measured (`run`: whether it loaded models, and their seconds: the ETA's cost model reads
-- them with the runs); its input images stay until the retention purge so a re-roll of an
-- edit can use them again. No row: the lease was lost
SELECT * FROM comfyveil_complete_job(
    %(job_id)s::uuid, %(worker_id)s::text, %(filenames)s::text[], %(kinds)s::text[],
    %(mimes)s::text[], %(datas)s::bytea[], %(refs)s::jsonb, %(sinks)s::text[],
    %(claim_seconds)s::float8, %(run)s::jsonb
);

-- fail_job --
-- Requeue a job after a transient error while attempts remain, else mark it failed
-- A requeued job keeps submitted and backend: its prompt may still run there, and the next
-- attempt re-attaches to it (or takes it back out) instead of paying for it twice.
-- A job its user asked to cancel ends cancelled whatever its attempt met: the cancel may
-- have landed while the attempt was failing, before its worker heard of it.
WITH target AS (
    SELECT id, (%(transient)s AND attempts < max_attempts AND NOT cancel_requested) AS retry,
           cancel_requested AS cancelled
    FROM jobs
    WHERE id = %(job_id)s AND status = 'running' AND lease_owner = %(worker_id)s
    FOR UPDATE
), updated AS (
    UPDATE jobs j
    SET status = CASE WHEN t.retry THEN 'queued'::job_status
                      WHEN t.cancelled THEN 'cancelled'::job_status
                      ELSE 'failed'::job_status END,
        not_before = CASE WHEN t.retry THEN now() + make_interval(secs => %(backoff)s)
                          ELSE j.not_before END,
        finished_at = CASE WHEN t.retry THEN NULL ELSE now() END,
        -- the GPU its first ETA named failed it: the next ETA names one afresh
        plan = NULL,
        error = %(error)s,
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = now()
    FROM target t
    WHERE j.id = t.id
    RETURNING j.*
), event AS (
    INSERT INTO job_events (job_id, kind, status, data)
    SELECT id, CASE status WHEN 'queued' THEN 'retry_scheduled' WHEN 'cancelled' THEN 'cancelled'
                           ELSE 'failed' END, status,
           jsonb_build_object('error', error, 'attempt', attempts, 'not_before', not_before)
    FROM updated
), dropped AS (
    DELETE FROM job_inputs
    WHERE job_id IN (SELECT id FROM updated WHERE status IN ('failed', 'cancelled'))
)
SELECT * FROM updated;

-- cancel_job --
-- Cancel a queued job at once, or ask the worker running it to stop
WITH target AS (
    SELECT id, status AS old_status
    FROM jobs
    WHERE id = %(job_id)s
      AND (%(user_id)s::bigint IS NULL OR user_id = %(user_id)s::bigint)
      AND (status = 'queued' OR (status = 'running' AND NOT cancel_requested))
    FOR UPDATE
), updated AS (
    UPDATE jobs j
    SET status = CASE WHEN t.old_status = 'queued' THEN 'cancelled'::job_status
                      ELSE j.status END,
        finished_at = CASE WHEN t.old_status = 'queued' THEN now() ELSE j.finished_at END,
        cancel_requested = true,
        updated_at = now()
    FROM target t
    WHERE j.id = t.id
    RETURNING j.*
), event AS (
    INSERT INTO job_events (job_id, kind, status, data)
    SELECT id, CASE WHEN status = 'cancelled' THEN 'cancelled' ELSE 'cancel_requested' END,
           status, jsonb_build_object('by_user', %(user_id)s::bigint)
    FROM updated
), dropped AS (
    DELETE FROM job_inputs WHERE job_id IN (SELECT id FROM updated WHERE status = 'cancelled')
)
SELECT * FROM updated;

-- mark_cancelled --
-- A worker stopped a running job on request: mark it cancelled
WITH updated AS (
    UPDATE jobs
    SET status = 'cancelled', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL,
        cancel_requested = true, updated_at = now()
    WHERE id = %(job_id)s AND status = 'running' AND lease_owner = %(worker_id)s
    RETURNING *
), event AS (
    INSERT INTO job_events (job_id, kind, status, data)
    SELECT id, 'cancelled', status, '{}'::jsonb FROM updated
), dropped AS (
    DELETE FROM job_inputs WHERE job_id IN (SELECT id FROM updated)
)
SELECT * FROM updated;

-- release_job --
-- Hand a running job back to the queue on a clean shutdown, without counting an attempt
WITH updated AS (
    UPDATE jobs
    SET status = 'queued', attempts = greatest(attempts - 1, 0), lease_owner = NULL,
        lease_expires_at = NULL, updated_at = now()
    WHERE id = %(job_id)s AND status = 'running' AND lease_owner = %(worker_id)s
    RETURNING *
), event AS (
    INSERT INTO job_events (job_id, kind, status, data)
    SELECT id, 'released', status, jsonb_build_object('worker', %(worker_id)s::text,
                                                      'submitted', submitted, 'backend', backend)
    FROM updated
)
SELECT * FROM updated;

-- recover_expired --
-- Requeue running jobs whose worker stopped renewing its lease (keeping submitted/backend).
-- A lease that ran out while this server was down or starting did so because nobody could
-- write, not because its worker died: leases count only from lease_seconds after the
-- server first answered since it started (the first recover_expired then records it:
-- migration 0020), which gives every live worker that long to renew once it is back.
WITH started AS (
    SELECT pg_postmaster_start_time() AS at
), earlier_starts AS (
    DELETE FROM server_starts WHERE started_at <> (SELECT at FROM started)
), first_answer AS (
    INSERT INTO server_starts (started_at) SELECT at FROM started
    ON CONFLICT (started_at) DO NOTHING
), expired AS (
    SELECT id, lease_owner AS old_owner,
           CASE WHEN cancel_requested THEN 'cancelled'::job_status
                WHEN attempts >= max_attempts THEN 'failed'::job_status
                ELSE 'queued'::job_status END AS new_status
    FROM jobs
    WHERE status = 'running' AND lease_expires_at < now()
      -- No row yet (this is the first answer): NULL, and nothing is taken.
      AND (SELECT answered_at FROM server_starts WHERE started_at = (SELECT at FROM started))
          < now() - make_interval(secs => %(lease_seconds)s)
    FOR UPDATE SKIP LOCKED
), updated AS (
    UPDATE jobs j
    SET status = e.new_status,
        finished_at = CASE WHEN e.new_status = 'queued' THEN NULL ELSE now() END,
        error = CASE WHEN e.new_status = 'failed'
                     THEN 'the job was interrupted too many times' ELSE j.error END,
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = now()
    FROM expired e
    WHERE j.id = e.id
    RETURNING j.*, e.old_owner
), event AS (
    INSERT INTO job_events (job_id, kind, status, data)
    SELECT id, 'lease_expired', status,
           jsonb_build_object('worker', old_owner, 'submitted', submitted, 'backend', backend)
    FROM updated
), dropped AS (
    DELETE FROM job_inputs
    WHERE job_id IN (SELECT id FROM updated WHERE status <> 'queued')
)
SELECT * FROM updated;

-- requeue_own --
-- A worker restarted under the same id gives its own running jobs back at once (it knows
-- they have no live worker: it is that worker), as recover_expired would once their leases
-- ran out, keeping submitted/backend so that whoever claims them re-attaches
WITH expired AS (
    SELECT id, lease_owner AS old_owner,
           CASE WHEN cancel_requested THEN 'cancelled'::job_status
                WHEN attempts >= max_attempts THEN 'failed'::job_status
                ELSE 'queued'::job_status END AS new_status
    FROM jobs
    WHERE status = 'running' AND lease_owner = %(worker_id)s
    FOR UPDATE
), updated AS (
    UPDATE jobs j
    SET status = e.new_status,
        finished_at = CASE WHEN e.new_status = 'queued' THEN NULL ELSE now() END,
        error = CASE WHEN e.new_status = 'failed'
                     THEN 'the job was interrupted too many times' ELSE j.error END,
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = now()
    FROM expired e
    WHERE j.id = e.id
    RETURNING j.*, e.old_owner
), event AS (
    INSERT INTO job_events (job_id, kind, status, data)
    SELECT id, 'lease_expired', status,
           jsonb_build_object('worker', old_owner, 'submitted', submitted, 'backend', backend,
                              'restarted', true)
    FROM updated
), dropped AS (
    DELETE FROM job_inputs
    WHERE job_id IN (SELECT id FROM updated WHERE status <> 'queued')
)
SELECT * FROM updated;

-- key_used --
-- Whether a job of this user was queued with this idempotency key (a retried request)
SELECT 1 AS used FROM jobs WHERE idempotency_key = %(key)s AND user_id = %(user_id)s;

-- get_job --
-- One job by id
SELECT * FROM jobs WHERE id = %(job_id)s;

-- find_jobs_by_id_range --
-- Jobs whose id lies between two ids (an id prefix, as the chat shows it), newest first
SELECT * FROM jobs WHERE id BETWEEN %(low)s AND %(high)s
ORDER BY created_at DESC LIMIT %(limit)s;

-- list_user_jobs --
-- A user's most recent jobs, newest first (only those asked for in one chat, if given)
SELECT * FROM jobs
WHERE user_id = %(user_id)s
  AND (%(chat_id)s::bigint IS NULL OR chat_id = %(chat_id)s::bigint)
  AND (%(statuses)s::job_status[] IS NULL OR status = ANY(%(statuses)s::job_status[]))
ORDER BY created_at DESC, id
LIMIT %(limit)s;

-- list_recent_jobs --
-- Everyone's most recent jobs, newest first (operators' view)
SELECT * FROM jobs
WHERE (%(statuses)s::job_status[] IS NULL OR status = ANY(%(statuses)s::job_status[]))
ORDER BY created_at DESC, id
LIMIT %(limit)s;

-- queue_length --
-- How many jobs wait in the queue
SELECT count(*) AS queued FROM jobs WHERE status = 'queued';

-- queue_counts --
-- Jobs queued and running now, for the metrics
SELECT count(*) FILTER (WHERE status = 'queued') AS queued,
       count(*) FILTER (WHERE status = 'running') AS running
FROM jobs WHERE status IN ('queued', 'running');

-- scrape_counts --
-- What a metrics scrape reads, in one round trip: jobs queued and running, workers alive
SELECT (SELECT count(*) FROM jobs WHERE status = 'queued') AS queued,
       (SELECT count(*) FROM jobs WHERE status = 'running') AS running,
       (SELECT count(*) FROM worker_heartbeats
        WHERE last_seen > now() - make_interval(secs => %(lease_seconds)s)) AS alive;

-- beat --
-- A worker is alive: write (or rewrite) its heartbeat row
INSERT INTO worker_heartbeats (worker_id, host, version, started_at, last_seen, jobs_running)
VALUES (%(worker_id)s, %(host)s, %(version)s, %(started_at)s, now(), %(jobs_running)s)
ON CONFLICT (worker_id) DO UPDATE
SET host = EXCLUDED.host, version = EXCLUDED.version, started_at = EXCLUDED.started_at,
    last_seen = now(), jobs_running = EXCLUDED.jobs_running;

-- stop_beating --
-- A worker stopped cleanly: its row goes (a worker that dies keeps it, shown as gone)
DELETE FROM worker_heartbeats WHERE worker_id = %(worker_id)s;

-- heartbeats --
-- Every worker's heartbeat, newest first, with whether it spoke within the lease
SELECT worker_id, host, version, started_at, last_seen, jobs_running,
       last_seen > now() - make_interval(secs => %(lease_seconds)s) AS alive
FROM worker_heartbeats
ORDER BY alive DESC, last_seen DESC
LIMIT %(limit)s;

-- workers_alive --
-- How many workers spoke within the lease
SELECT count(*) AS alive FROM worker_heartbeats
WHERE last_seen > now() - make_interval(secs => %(lease_seconds)s);

-- forget_heartbeats --
-- Rows of workers gone for longer than a day are of no more use to anyone
DELETE FROM worker_heartbeats WHERE last_seen < now() - interval '1 day';

-- set_status_message --
-- Remember the Telegram message that shows a job's status (and the one that asked for it)
UPDATE jobs SET status_message_id = %(message_id)s,
    request_message_id = coalesce(%(request_message_id)s::bigint, request_message_id),
    requested_by = coalesce(%(requested_by)s::text, requested_by),
    updated_at = now()
WHERE id = %(job_id)s
RETURNING *;

-- set_job_request --
-- Remember the chat message that asked for a job (and who, in groups) as it is queued, so
-- its result or ending answers that message from any process, with or without a status
-- message
UPDATE jobs SET request_message_id = %(request_message_id)s,
    requested_by = coalesce(%(requested_by)s::text, requested_by)
WHERE id = %(job_id)s;

-- jobs_with_status_message --
-- Jobs waiting or running whose status message the bot keeps current (after a restart)
SELECT * FROM jobs
WHERE status IN ('queued', 'running') AND status_message_id IS NOT NULL
ORDER BY created_at
LIMIT %(limit)s;

-- position_and_eta --
-- A queued job's place and the inputs of its ETA, in one pass: the queued jobs ahead of it
-- (in round-robin claim order), and the mean of the last 20 successful runs of each command
-- among them and its own (as command_durations). queued is false when the job is not queued.
WITH queued AS (
    SELECT j.id, j.command, j.priority, j.created_at, j.backends,
           row_number() OVER (PARTITION BY j.user_id
                              ORDER BY j.priority DESC, j.created_at, j.id) AS round,
           coalesce(t.turn, -1) AS turn
    FROM jobs j
    LEFT JOIN queue_turns t ON t.user_id = j.user_id
    WHERE j.status = 'queued'
), me AS (
    SELECT * FROM queued WHERE id = %(job_id)s
), ahead AS (
    SELECT q.command, count(*) AS ahead
    FROM queued q, me
    WHERE q.id <> me.id
      AND (q.backends IS NULL OR me.backends IS NULL OR q.backends && me.backends)
      AND (-q.priority, q.round, q.turn, q.created_at, q.id)
          < (-me.priority, me.round, me.turn, me.created_at, me.id)
    GROUP BY q.command
), means AS (
    -- the last 20 runs of each command, read newest first from jobs_recent_runs_idx
    SELECT c.command,
           (SELECT avg(extract(epoch FROM r.finished_at - r.started_at))::float8
            FROM (SELECT finished_at, started_at FROM jobs
                  WHERE status = 'succeeded' AND started_at IS NOT NULL
                    AND command = c.command
                  ORDER BY finished_at DESC
                  LIMIT 20) r) AS seconds
    FROM (SELECT command FROM ahead UNION SELECT command FROM me) c
), own AS (
    SELECT m.seconds FROM means m, me WHERE m.command = me.command
)
SELECT EXISTS (SELECT 1 FROM me) AS queued,
       coalesce((SELECT sum(ahead) FROM ahead), 0)::int AS ahead,
       (SELECT seconds FROM own) AS own_seconds,
       (SELECT sum(a.ahead * coalesce(m.seconds, (SELECT seconds FROM own)))::float8
        FROM ahead a LEFT JOIN means m ON m.command = a.command) AS waiting_seconds;

-- running_remaining --
-- Seconds the running jobs still need by their measured runs (the mean of the last 20 runs
-- of the command on the job's own backend, else on any), for the ETA of those queued
SELECT coalesce(sum(greatest(
           coalesce(b.seconds, a.seconds, 0) - extract(epoch FROM now() - r.started_at), 0
       )), 0)::float8 AS seconds
FROM jobs r
LEFT JOIN LATERAL (
    SELECT avg(extract(epoch FROM x.finished_at - x.started_at))::float8 AS seconds
    FROM (SELECT finished_at, started_at FROM jobs
          WHERE status = 'succeeded' AND started_at IS NOT NULL AND command = r.command
            AND backend = r.backend
          ORDER BY finished_at DESC LIMIT 20) x
) b ON true
LEFT JOIN LATERAL (
    SELECT avg(extract(epoch FROM x.finished_at - x.started_at))::float8 AS seconds
    FROM (SELECT finished_at, started_at FROM jobs
          WHERE status = 'succeeded' AND started_at IS NOT NULL AND command = r.command
          ORDER BY finished_at DESC LIMIT 20) x
) a ON true
WHERE r.status = 'running' AND r.started_at IS NOT NULL;

-- job_for_delivery --
-- One job by id with its user's settings (NULL when the user has no row)
SELECT j.*, u.settings AS user_settings
FROM jobs j LEFT JOIN users u ON u.id = j.user_id
WHERE j.id = %(job_id)s;

-- command_durations --
-- Mean run time in seconds of the last 20 successful runs per command (on one backend or any)
SELECT c.command, r.seconds, r.samples
FROM (SELECT DISTINCT unnest(%(commands)s::text[]) AS command) c
CROSS JOIN LATERAL (
    SELECT avg(extract(epoch FROM finished_at - started_at))::float8 AS seconds,
           count(*) AS samples
    FROM (
        -- each branch reads the newest 20 from its index; one of them is switched off
        (SELECT finished_at, started_at FROM jobs
         WHERE status = 'succeeded' AND started_at IS NOT NULL AND command = c.command
           AND %(backend)s::text IS NULL
         ORDER BY finished_at DESC
         LIMIT 20)
        UNION ALL
        (SELECT finished_at, started_at FROM jobs
         WHERE status = 'succeeded' AND started_at IS NOT NULL AND command = c.command
           AND backend = %(backend)s::text
         ORDER BY finished_at DESC
         LIMIT 20)
    ) recent
) r
WHERE r.samples > 0;

-- job_inputs --
-- A job's input images, in order
SELECT * FROM job_inputs WHERE job_id = %(job_id)s ORDER BY index;

-- job_outputs --
-- A job's output files, in order
SELECT * FROM job_outputs WHERE job_id = %(job_id)s ORDER BY index;

-- job_events --
-- A job's history, oldest first
SELECT * FROM job_events WHERE job_id = %(job_id)s ORDER BY id;

-- record_delivery --
-- Note that a job's result went to a sink (or was skipped, or given up); nothing when it
-- already had
INSERT INTO deliveries (job_id, sink, detail, outcome)
VALUES (%(job_id)s, %(sink)s, %(detail)s, %(outcome)s)
ON CONFLICT (job_id, sink) DO NOTHING
RETURNING job_id;

-- delivery_failed --
-- A try to deliver failed: count it and hold the next try back (the claim's expiry) for
-- a delay that doubles with each failure; at %(max_failures)s failures record the delivery
-- as failed. No row: the claim is gone (the job was forgotten)
WITH claim AS (
    UPDATE delivery_claims
    SET failures = failures + 1,
        last_error = %(error)s,
        claimed_until = now() + make_interval(
            secs => least(%(backoff_max)s, %(backoff)s * power(2, failures)))
    WHERE job_id = %(job_id)s AND sink = %(sink)s
    RETURNING job_id, sink, failures
), given_up AS (
    INSERT INTO deliveries (job_id, sink, outcome, detail)
    SELECT job_id, sink, 'failed',
           jsonb_build_object('error', %(error)s::text, 'failures', failures)
    FROM claim
    WHERE failures >= %(max_failures)s
    ON CONFLICT (job_id, sink) DO NOTHING
    RETURNING job_id
)
SELECT c.failures, EXISTS (SELECT 1 FROM given_up) AS given_up FROM claim c;

-- deliver_again_now --
-- The destination is back: end the wait this worker's failed tries of these deliveries
-- earned (their claims' expiry), so that they are tried now, not after the delay
UPDATE delivery_claims
SET claimed_until = now()
WHERE sink = %(sink)s AND claimed_by = %(worker_id)s AND failures > 0
  AND claimed_until > now() AND job_id = ANY(%(job_ids)s::uuid[])
RETURNING job_id;

-- delivery_outcome --
-- How a job's delivery to a sink ended (no row: not yet)
SELECT outcome, detail, delivered_at FROM deliveries
WHERE job_id = %(job_id)s AND sink = %(sink)s;

-- undelivered_jobs --
-- Finished jobs whose result has not reached a sink yet, oldest first (the statement is in
-- migration 0009: finished jobs grouped by the sinks that have them, read only in the
-- groups that lack this one); since migration 0012 those someone is delivering now, or
-- whose last try failed a moment ago, wait (their claim is live), so results that cannot
-- be delivered never hide the ones behind them
SELECT * FROM comfyveil_undelivered_jobs(%(sink)s::text, %(limit)s::int);

-- claim_delivery --
-- Take the right to deliver a finished job to a sink for a while; no row: someone has it
INSERT INTO delivery_claims (job_id, sink, claimed_by, claimed_until)
SELECT %(job_id)s, %(sink)s, %(worker_id)s, now() + make_interval(secs => %(seconds)s)
WHERE NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.job_id = %(job_id)s AND d.sink = %(sink)s)
ON CONFLICT (job_id, sink) DO UPDATE
SET claimed_by = excluded.claimed_by, claimed_until = excluded.claimed_until
WHERE delivery_claims.claimed_until < now()
RETURNING job_id;

-- purge_expired --
-- Delete finished jobs (and their images, outputs, events) older than the retention, with
-- what names them outside the job tables: the webhook events told of them (delivered or
-- given up; one still due is sent first; they name their job only in the payload, so no
-- cascade takes them), those of jobs deleted otherwise (DELETE /v1/jobs, a purge of an
-- older version), and the images API's records of the requests that queued them.
-- `left_over`: the jobs still there (every part of the statement sees the jobs as they were
-- before it: the purged ones are named apart).
WITH purged AS (
    DELETE FROM jobs
    WHERE status IN ('succeeded', 'failed', 'cancelled')
      AND finished_at < now() - make_interval(secs => %(older_than)s)
    RETURNING id
), told AS (
    DELETE FROM webhook_deliveries d
    WHERE (d.delivered_at IS NOT NULL OR d.given_up_at IS NOT NULL)
      AND (d.payload #>> '{data,id}' IN (SELECT id::text FROM purged)
           OR NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = (d.payload #>> '{data,id}')::uuid))
), asked AS (
    -- whatever its count of clients says (a process killed while its client waited
    -- never counted it out): no client waits for a job that long
    DELETE FROM api_requests
    WHERE job_ids && ARRAY(SELECT id FROM purged)
)
SELECT count(*) AS purged, (SELECT count(*) FROM jobs) - count(*) AS left_over FROM purged;

-- list_users --
-- The most recently active users (a users row or a job) with role, quota and jobs today,
-- and the name of the web account that is this user, if any
WITH known AS (
    SELECT id, updated_at AS seen FROM users
    UNION ALL
    SELECT user_id, max(created_at) FROM jobs GROUP BY user_id
), latest AS (
    SELECT id, max(seen) AS seen FROM known GROUP BY id
)
SELECT l.id, coalesce(u.role, 'user') AS role, u.daily_quota,
       coalesce((u.settings->>'allowed')::boolean, false) AS granted,
       coalesce((SELECT g.jobs_today FROM user_usage g
                 WHERE g.user_id = l.id AND g.day = (now() AT TIME ZONE 'UTC')::date), 0)
       AS today,
       a.name AS web_name, coalesce(a.is_admin, false) AS web_admin
FROM latest l LEFT JOIN users u ON u.id = l.id LEFT JOIN web_accounts a ON a.user_id = l.id
ORDER BY l.seen DESC NULLS LAST, l.id
LIMIT %(limit)s;

-- get_or_create_user --
-- A user's row, created with the given role on first sight
WITH inserted AS (
    INSERT INTO users (id, role) VALUES (%(user_id)s, %(role)s)
    ON CONFLICT (id) DO NOTHING
    RETURNING *
)
SELECT * FROM inserted
UNION ALL
SELECT * FROM users WHERE id = %(user_id)s
LIMIT 1;

-- list_admin_ids --
-- Users given the admin role
SELECT id FROM users WHERE role = 'admin' ORDER BY id;

-- get_user --
-- One user by Telegram id
SELECT * FROM users WHERE id = %(user_id)s;

-- set_user_role --
-- Give a user a role (user, admin, banned)
INSERT INTO users (id, role) VALUES (%(user_id)s, %(role)s)
ON CONFLICT (id) DO UPDATE SET role = excluded.role, updated_at = now()
RETURNING *;

-- set_user_daily_quota --
-- Override the daily quota of one user (NULL: the configured default)
INSERT INTO users (id, daily_quota) VALUES (%(user_id)s, %(daily_quota)s)
ON CONFLICT (id) DO UPDATE SET daily_quota = excluded.daily_quota, updated_at = now()
RETURNING *;

-- update_user_settings --
-- Merge settings into a user's settings and remove the named keys
INSERT INTO users (id, settings) VALUES (%(user_id)s, %(changes)s::jsonb - %(remove)s::text[])
ON CONFLICT (id) DO UPDATE
SET settings = (users.settings || %(changes)s::jsonb) - %(remove)s::text[], updated_at = now()
RETURNING *;

-- quota_used_today --
-- How many jobs a user queued today (UTC), forgotten ones included
SELECT coalesce(max(jobs_today), 0) AS used FROM user_usage
WHERE user_id = %(user_id)s AND day = (now() AT TIME ZONE 'UTC')::date;

-- refund_quota --
-- A failed job gives its quota back (it failed through no fault of its user), as does one
-- cancelled while its attempt met such a failure; the trigger of migration 0010 takes it off
-- the user's count of today's jobs
UPDATE jobs SET quota_refunded = true, updated_at = now()
WHERE id = %(job_id)s AND status IN ('failed', 'cancelled') AND NOT quota_refunded
RETURNING id;

-- forget_user_jobs --
-- Delete a user's jobs (inputs, outputs, events, deliveries go with them), except those
-- running now: those lose their content and are asked to stop (the event's NOTIFY tells
-- their worker, which interrupts the prompt on its backend and ends them cancelled).
-- Rows are locked first, so a job claimed meanwhile is seen as running, not deleted.
WITH mine AS (
    SELECT id, status FROM jobs WHERE user_id = %(user_id)s FOR UPDATE
), stopped AS (
    UPDATE jobs j
    SET params = '{}'::jsonb, progress = '{}'::jsonb, error = NULL, idempotency_key = NULL,
        cancel_requested = true, updated_at = now()
    FROM mine m
    WHERE j.id = m.id AND m.status = 'running'
    RETURNING j.id, j.status
), stop_event AS (
    INSERT INTO job_events (job_id, kind, status, data)
    SELECT id, 'cancel_requested', status, jsonb_build_object('forgotten', true) FROM stopped
), old_events AS (
    DELETE FROM job_events WHERE job_id IN (SELECT id FROM stopped)
), old_inputs AS (
    DELETE FROM job_inputs WHERE job_id IN (SELECT id FROM stopped)
), deleted AS (
    DELETE FROM jobs j USING mine m
    WHERE j.id = m.id AND m.status <> 'running'
    RETURNING j.id
), hooks AS (
    -- their webhook deliveries name the job only in the payload: no cascade takes them
    DELETE FROM webhook_deliveries
    WHERE payload -> 'data' ->> 'id' IN (SELECT id::text FROM deleted)
)
SELECT (SELECT count(*) FROM deleted) + (SELECT count(*) FROM stopped) AS deleted,
       (SELECT count(*) FROM stopped) AS stopping;

-- forget_user_rest --
-- Delete a user's chat sessions, queue turn, settings and user row; an admin's decisions
-- about the user (role, own quota, an /allow) stay, with no settings beside them, and so
-- do the usage counters (user_usage) the limits read
WITH sessions AS (
    DELETE FROM chat_sessions WHERE user_id = %(user_id)s OR chat_id = %(user_id)s
), turns AS (
    DELETE FROM queue_turns WHERE user_id = %(user_id)s
), kept AS (
    UPDATE users
    SET settings = CASE WHEN settings ? 'allowed'
                        THEN jsonb_build_object('allowed', settings -> 'allowed')
                        ELSE '{}'::jsonb END,
        updated_at = now()
    WHERE id = %(user_id)s
      AND (role <> 'user' OR daily_quota IS NOT NULL OR settings ? 'allowed')
    RETURNING id
)
DELETE FROM users WHERE id = %(user_id)s AND NOT EXISTS (SELECT 1 FROM kept);

-- set_chat_outputs --
-- Remember the last result in a chat, for chaining
INSERT INTO chat_sessions (chat_id, user_id, job_id, outputs)
VALUES (%(chat_id)s, %(user_id)s, %(job_id)s, %(outputs)s)
ON CONFLICT (chat_id) DO UPDATE
SET user_id = excluded.user_id, job_id = excluded.job_id, outputs = excluded.outputs,
    updated_at = now()
RETURNING *;

-- get_chat_session --
-- The last result in a chat
SELECT * FROM chat_sessions WHERE chat_id = %(chat_id)s;

-- clear_chat_session --
-- Forget the last result in a chat
DELETE FROM chat_sessions WHERE chat_id = %(chat_id)s RETURNING chat_id;

-- upsert_shipped_command --
-- Add or refresh a shipped command; an operator's command of that name and the enabled flag stay
INSERT INTO commands (command, workflow, title, description, kind, toml, graph, hash, source)
VALUES (%(command)s, %(workflow)s, %(title)s, %(description)s, %(kind)s, %(toml)s, %(graph)s,
        %(hash)s, 'shipped')
ON CONFLICT (command) DO UPDATE
SET workflow = excluded.workflow, title = excluded.title, description = excluded.description,
    kind = excluded.kind, toml = excluded.toml, graph = excluded.graph, hash = excluded.hash,
    updated_at = now()
WHERE commands.source = 'shipped' AND commands.hash IS DISTINCT FROM excluded.hash
RETURNING *;

-- upsert_operator_command --
-- Add or replace a command from an operator's own workflow
INSERT INTO commands (command, workflow, title, description, kind, toml, graph, hash, source,
                      enabled, allowed_roles, limits)
VALUES (%(command)s, %(workflow)s, %(title)s, %(description)s, %(kind)s, %(toml)s, %(graph)s,
        %(hash)s, 'operator', %(enabled)s, %(allowed_roles)s, %(limits)s)
ON CONFLICT (command) DO UPDATE
SET workflow = excluded.workflow, title = excluded.title, description = excluded.description,
    kind = excluded.kind, toml = excluded.toml, graph = excluded.graph, hash = excluded.hash,
    source = 'operator', enabled = excluded.enabled, allowed_roles = excluded.allowed_roles,
    limits = excluded.limits, updated_at = now()
RETURNING *;

-- set_command_enabled --
-- Turn a command on or off
UPDATE commands SET enabled = %(enabled)s, updated_at = now()
WHERE command = %(command)s
RETURNING *;

-- get_command --
-- One command by name
SELECT * FROM commands WHERE command = %(command)s;

-- list_commands --
-- All commands, or only the enabled ones, by name
SELECT * FROM commands
WHERE (NOT %(enabled_only)s OR enabled)
ORDER BY command;

-- save_workflow_version --
-- Keep the exact texts of a workflow a job names by hash (once per hash)
INSERT INTO workflow_versions (hash, workflow, toml, graph)
VALUES (%(hash)s, %(workflow)s, %(toml)s, %(graph)s)
ON CONFLICT (hash) DO NOTHING;

-- get_workflow_version --
-- The texts of a workflow by its content hash
SELECT * FROM workflow_versions WHERE hash = %(hash)s;

-- delete_command --
-- Remove a command
DELETE FROM commands WHERE command = %(command)s RETURNING command;

-- notify_commands_changed --
-- Tell every bot and web server to read the commands again (sent when the change commits)
SELECT pg_notify('comfyveil_commands', %(command)s);

-- lock_migrations --
-- Let one process at a time migrate (held until the transaction ends)
SELECT pg_advisory_xact_lock(1129270861);

-- create_migrations_table --
-- The table recording applied migrations
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    text PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- migrations_table_exists --
-- Whether the database has ever been migrated
SELECT to_regclass('schema_migrations') IS NOT NULL AS present;

-- applied_migrations --
-- Migrations applied so far, in order
SELECT version, name, applied_at FROM schema_migrations ORDER BY version;

-- record_migration --
-- Note that a migration was applied
INSERT INTO schema_migrations (version, name) VALUES (%(version)s, %(name)s);

-- record_traces --
-- Write down what a job is about to leave on a backend (one row per trace)
INSERT INTO backend_traces (job_id, user_id, backend, kind, name, folder, subfolder)
SELECT %(job_id)s, j.user_id, %(backend)s, t.kind, t.name, t.folder, t.subfolder
FROM unnest(%(kinds)s::text[], %(names)s::text[], %(folders)s::text[], %(subfolders)s::text[])
     AS t (kind, name, folder, subfolder)
LEFT JOIN jobs j ON j.id = %(job_id)s
ON CONFLICT ON CONSTRAINT backend_traces_unique DO NOTHING;

-- drop_traces --
-- Strike out traces that are gone from their backend
DELETE FROM backend_traces
WHERE backend = %(backend)s
  AND (kind, name, folder, subfolder) IN (
      SELECT * FROM unnest(%(kinds)s::text[], %(names)s::text[], %(folders)s::text[],
                           %(subfolders)s::text[])
  );

-- job_traces --
-- What one job left on one backend
SELECT * FROM backend_traces WHERE job_id = %(job_id)s AND backend = %(backend)s ORDER BY id;

-- settled_traces --
-- Traces of jobs that no longer run anywhere (ended, forgotten or purged), or all of one
-- user's, oldest first
SELECT t.* FROM backend_traces t
LEFT JOIN jobs j ON j.id = t.job_id
WHERE CASE WHEN %(user_id)s::bigint IS NULL
           THEN j.id IS NULL OR j.status IN ('succeeded', 'failed', 'cancelled')
           ELSE t.user_id = %(user_id)s END
ORDER BY t.id
LIMIT %(limit)s;

-- disown_traces --
-- A forgotten user's traces stay only as backend, prompt id and file name, for the sweep
UPDATE backend_traces SET user_id = NULL WHERE user_id = %(user_id)s;

-- count_refusal --
-- Add one to today's (UTC) count of prompts the content policy refused for a command
INSERT INTO policy_refusals (day, command, refused)
VALUES ((now() AT TIME ZONE 'UTC')::date, %(command)s, 1)
ON CONFLICT (day, command) DO UPDATE SET refused = policy_refusals.refused + 1;

-- refusal_counts --
-- Refusals per command: today (UTC), the last 7 days with today, and in all
SELECT command,
       sum(refused) FILTER (WHERE day = (now() AT TIME ZONE 'UTC')::date) AS today,
       sum(refused) FILTER (WHERE day > (now() AT TIME ZONE 'UTC')::date - 7) AS week,
       sum(refused) AS total
FROM policy_refusals
GROUP BY command
ORDER BY total DESC, command;

-- eta_state --
-- What a job's ETA (store/eta.py) needs, in one round trip: the job itself; the jobs to
-- be claimed before it, in claim order, with the backends each may use; the other jobs
-- on the backends now, with how long each has run since ComfyUI started it (NULL: waiting
-- on its backend) and its progress; and the last runs of each command among them. Each
-- job comes with the parameters its work is counted from (steps, size, frames: `size`).
-- The order is position_and_eta's.
WITH queued AS (
    SELECT j.id, j.command, j.priority, j.created_at, j.backends,
           row_number() OVER (PARTITION BY j.user_id
                              ORDER BY j.priority DESC, j.created_at, j.id) AS round,
           coalesce(t.turn, -1) AS turn
    FROM jobs j
    LEFT JOIN queue_turns t ON t.user_id = j.user_id
    WHERE j.status = 'queued'
), mine AS (
    SELECT j.id, j.command, j.status, j.backends, j.started_at, j.plan,
           coalesce(j.backend, j.progress->>'backend') AS backend,
           j.progress->>'state' AS state,
           extract(epoch FROM now() - coalesce(j.executing_at, j.started_at))::float8
               AS elapsed,
           jsonb_build_object('steps', j.params->'steps', 'width', j.params->'width',
                              'height', j.params->'height', 'length', j.params->'length',
                              'megapixels', j.params->'megapixels',
                              'batch_size', j.params->'batch_size') AS size,
           j.progress->'value' AS done, j.progress->'max' AS steps,
           j.progress->'step_s' AS step_s
    FROM jobs j WHERE j.id = %(job_id)s
), me AS (
    SELECT * FROM queued WHERE id = %(job_id)s
), ahead AS (
    SELECT q.command, q.backends, q.priority, q.round, q.turn, q.created_at, q.id
    FROM queued q, me
    WHERE q.id <> me.id
      AND (q.backends IS NULL OR me.backends IS NULL OR q.backends && me.backends)
      AND (-q.priority, q.round, q.turn, q.created_at, q.id)
          < (-me.priority, me.round, me.turn, me.created_at, me.id)
), on_gpus AS (
    SELECT r.id, r.command, r.backends, r.started_at, r.plan,
           coalesce(r.backend, r.progress->>'backend') AS backend,
           r.progress->>'state' AS state,
           extract(epoch FROM now() - coalesce(r.executing_at, r.started_at))::float8
               AS elapsed,
           jsonb_build_object('steps', r.params->'steps', 'width', r.params->'width',
                              'height', r.params->'height', 'length', r.params->'length',
                              'megapixels', r.params->'megapixels',
                              'batch_size', r.params->'batch_size') AS size,
           r.progress->'value' AS done, r.progress->'max' AS steps,
           r.progress->'step_s' AS step_s
    FROM jobs r
    WHERE r.status = 'running' AND r.id <> %(job_id)s
)
SELECT m.command, m.status, m.backends, m.backend, m.state, m.elapsed, m.size, m.done,
       m.steps, m.step_s, m.plan,
       EXISTS (SELECT 1 FROM me) AS queued,
       (SELECT count(*) FROM ahead)::int AS ahead_count,
       -- queued after ours, or on other GPUs only: the pool's rule sends a job with work
       -- waiting behind it to a free GPU rather than wait for a busy one
       CASE WHEN EXISTS (SELECT 1 FROM me)
            THEN (SELECT count(*) FROM queued)::int - 1 - (SELECT count(*) FROM ahead)::int
            ELSE 0 END AS behind_count,
       -- the sizes of the first 2000 only (those the ETA looks at one by one)
       coalesce((SELECT json_agg(json_build_array(
                            a.command, a.backends, a.id,
                            jsonb_build_object('steps', p.params->'steps',
                                               'width', p.params->'width',
                                               'height', p.params->'height',
                                               'length', p.params->'length',
                                               'megapixels', p.params->'megapixels',
                                               'batch_size', p.params->'batch_size'),
                            p.plan)
                                 ORDER BY -a.priority, a.round, a.turn, a.created_at, a.id)
                 FROM (SELECT * FROM ahead
                       ORDER BY -priority, round, turn, created_at, id LIMIT 2000) a
                 JOIN jobs p ON p.id = a.id),
                '[]'::json) AS ahead,
       -- claimed after ours: on ours' backend it waits behind ours
       coalesce((SELECT json_agg(json_build_array(g.command, g.backends, g.backend,
                                                  CASE WHEN g.state = 'running'
                                                       THEN g.elapsed END,
                                                  g.state, g.size, g.done, g.steps,
                                                  g.step_s, g.id,
                                                  coalesce(g.started_at > m.started_at,
                                                           false), g.plan)
                                 ORDER BY g.started_at)
                 FROM on_gpus g), '[]'::json) AS busy,
       -- the last runs of each command involved, from ComfyUI's start of each (or the
       -- claim, for runs recorded before that start was)
       coalesce((SELECT json_agg(json_build_array(
                            r.backend, c.command,
                            extract(epoch FROM coalesce(r.executing_at, r.started_at))::float8,
                            extract(epoch FROM r.finished_at)::float8,
                            r.size, r.progress->'max', r.progress->'step_s',
                            r.progress->'cold', r.progress->'load_s')
                                 ORDER BY r.finished_at)
                 FROM (SELECT command FROM mine UNION SELECT command FROM ahead
                       UNION SELECT command FROM on_gpus) c
                 CROSS JOIN LATERAL (
                     SELECT backend, started_at, executing_at, finished_at, progress,
                            jsonb_build_object(
                                'steps', params->'steps', 'width', params->'width',
                                'height', params->'height', 'length', params->'length',
                                'megapixels', params->'megapixels',
                                'batch_size', params->'batch_size') AS size
                     FROM jobs
                     WHERE status = 'succeeded' AND started_at IS NOT NULL
                       AND command = c.command
                     ORDER BY finished_at DESC LIMIT %(runs)s) r
                 WHERE r.backend IS NOT NULL), '[]'::json) AS runs
FROM mine m;

-- keep_plan --
-- The backend a queued job's first ETA announced (store/job_eta.py, `wait`); the pool
-- keeps the job to it (comfy/routing.py, `keep_plan`). Written once: a plan that moved
-- with later ETAs moved every ETA behind it too.
UPDATE jobs SET plan = %(plan)s WHERE id = %(job_id)s AND status = 'queued' AND plan IS NULL;

-- remember_model_lists --
-- A backend's node and model lists as it last answered them. Lists as kept already are
-- not written again: every process re-reads every GPU's (a real /object_info is 1-2 MB)
-- every few minutes and after each outage, and each write left a dead copy in the TOAST
-- table that VACUUM makes reusable but never gives back (read_at: when they last changed).
INSERT INTO backend_model_lists (backend, url_hash, object_info, read_at)
VALUES (%(backend)s, %(url_hash)s, %(object_info)s, now())
ON CONFLICT (backend) DO UPDATE
SET url_hash = EXCLUDED.url_hash, object_info = EXCLUDED.object_info, read_at = now()
WHERE backend_model_lists.url_hash IS DISTINCT FROM EXCLUDED.url_hash
   OR backend_model_lists.object_info IS DISTINCT FROM EXCLUDED.object_info;

-- recall_model_lists --
-- The lists last read from these backends, for a start while some do not answer
SELECT backend, url_hash, object_info FROM backend_model_lists
WHERE backend = ANY(%(backends)s::text[]);
