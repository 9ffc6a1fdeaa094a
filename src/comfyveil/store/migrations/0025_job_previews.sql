-- comfyveil schema: the sampler's latest preview of a job whose client asked to see
-- partial images (the images API's stream with `partial_images`).
--
-- The API writes the row first, empty (seq 0): it is the request for previews. A worker
-- running the job then writes the backend's newest preview frame over it, at most a few
-- times a second (`seq` counts them), and only for a job that has such a row: no other
-- job pays a write for its previews. The row goes with its job.
CREATE TABLE job_previews (
    job_id      uuid PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    seq         integer NOT NULL DEFAULT 0,
    mime        text NOT NULL DEFAULT '',
    data        bytea NOT NULL DEFAULT '',
    updated_at  timestamptz NOT NULL DEFAULT now()
);
