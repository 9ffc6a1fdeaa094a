-- comfyveil schema, version 17: workers say they are alive.
--
-- One row per worker, rewritten every third of its lease: an operator sees which workers
-- run (`comfyveil status`, /backends, the admin's backends page, the comfyveil_workers
-- metric), and a worker whose row is older than the lease is shown as gone. No user data.
CREATE TABLE worker_heartbeats (
    worker_id    text        PRIMARY KEY CHECK (length(worker_id) <= 200),
    host         text        NOT NULL CHECK (length(host) <= 255),
    version      text        NOT NULL CHECK (length(version) <= 64),
    started_at   timestamptz NOT NULL,
    last_seen    timestamptz NOT NULL DEFAULT now(),
    jobs_running integer     NOT NULL DEFAULT 0 CHECK (jobs_running >= 0)
);
