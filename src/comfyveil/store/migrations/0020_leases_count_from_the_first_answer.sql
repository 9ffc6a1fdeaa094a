-- comfyveil schema: after a restart, leases count from when the server first answered.
--
-- recover_expired gave live workers a lease's time from pg_postmaster_start_time() to
-- renew theirs. But the postmaster starts before crash recovery, which can take longer
-- than a lease (a long WAL to replay, a disk busy with fsyncs), and nobody can renew
-- anything until it ends: the workers' jobs were then taken from them the moment the
-- server opened. Now the first recover_expired after a start records when the server
-- answered, and leases count from a lease after that. The server this migration runs on
-- is taken as answering since its start, as before.
CREATE TABLE server_starts (
    started_at  timestamptz PRIMARY KEY,
    answered_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO server_starts (started_at, answered_at)
VALUES (pg_postmaster_start_time(), pg_postmaster_start_time());
