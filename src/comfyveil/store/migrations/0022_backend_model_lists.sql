-- comfyveil schema, version 22: the last node and model lists each backend answered.
--
-- The pool reads a backend's /object_info when it answers; a process started while a GPU
-- was down knew nothing of it, so /help and the menu offered every command and a job
-- needing a model no GPU has waited for the GPU instead of being refused. The last lists
-- are kept here and used until the backend answers again. One row per backend name,
-- valid only for the URL it was read from (kept as a hash: no address in the table). No
-- user data.
CREATE TABLE backend_model_lists (
    backend     text        PRIMARY KEY CHECK (length(backend) <= 200),
    url_hash    text        NOT NULL,
    object_info jsonb       NOT NULL,
    read_at     timestamptz NOT NULL DEFAULT now()
);
