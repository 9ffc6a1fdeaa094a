-- comfyveil schema: when ComfyUI really started a job's prompt.
--
-- started_at is when a worker claimed the job; the prompt may then wait for a free GPU
-- and, once sent, in the backend's own queue behind another prompt. A user's "running"
-- time, and the run times the ETA learns from, start when ComfyUI starts executing the
-- prompt (its execution_start event), which the worker records here. A new submission
-- clears it; a worker that re-attaches to a prompt already running there keeps it.
ALTER TABLE jobs ADD COLUMN executing_at timestamptz;
