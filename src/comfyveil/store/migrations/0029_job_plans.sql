-- comfyveil schema, version 29: the backend a queued job's ETA announced, which the pool
-- keeps it to.
--
-- The pool's rule has close calls (a free GPU that loads other models, or the busy one
-- that holds them); with runs a little shorter or longer they went either way, and the
-- ETA of every job behind moved by a model load each time one was decided. The ETA now
-- writes where it places a queued job (`plan`); the pool sends the job there unless the
-- runs strayed far since (comfy/routing.py, `keep_plan`), and every other job's ETA
-- counts it there. NULL: no ETA was shown yet; the rule alone decides.
ALTER TABLE jobs ADD COLUMN plan text CHECK (length(plan) <= 200);
