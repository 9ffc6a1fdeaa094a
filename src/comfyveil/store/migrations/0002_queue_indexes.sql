-- comfyveil schema, version 2: claim a job in time that does not grow with the queue.
--
-- claim_job walks the users who have queued jobs (a loose scan: one index probe per user)
-- and reads only the first few ready jobs of each, in that user's claim order. Both walks
-- use this index, so a claim costs a few probes per waiting user instead of a scan and
-- sort of every queued job.
CREATE INDEX jobs_queued_user_idx ON jobs (user_id, priority DESC, created_at, id)
    WHERE status = 'queued';
