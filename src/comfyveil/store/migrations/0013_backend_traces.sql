-- What a job left on a GPU host (its history entry, an uploaded input, an output file it
-- could not avoid writing), written down before it is left there and deleted once it is
-- gone, so that a successor after a crash, /forget and the retention purge can remove it.
-- No foreign key to jobs: a trace must outlive its job's row (forgotten, purged).
CREATE TABLE backend_traces (
    id         bigserial PRIMARY KEY,
    job_id     uuid NOT NULL,
    user_id    bigint,                                   -- NULL once the user is forgotten
    backend    text NOT NULL,
    kind       text NOT NULL
               CONSTRAINT backend_traces_kind_check CHECK (kind IN ('history', 'input', 'output')),
    name       text NOT NULL,                            -- the prompt id, or the file's name
    folder     text NOT NULL DEFAULT '',                 -- input, temp or output
    subfolder  text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT backend_traces_unique UNIQUE (backend, kind, folder, subfolder, name)
);
CREATE INDEX backend_traces_job_idx ON backend_traces (job_id);
CREATE INDEX backend_traces_user_idx ON backend_traces (user_id);
