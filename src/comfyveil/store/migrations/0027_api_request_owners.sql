-- comfyveil schema: which process's clients wait on an images API request, so a retry
-- takes the request over as soon as that process has died (killed, crashed) instead of
-- finding it waited for until the stale sweep a day later, and queueing (paying) again.
--
-- Each process serving the API holds, for its life, a session-level advisory lock on a
-- random 64-bit key on a connection of its own (store/presence.py); PostgreSQL drops a
-- dead process's session, and its lock, as soon as its socket closes. `owner` is the key
-- of the process whose client waits on the row; a row with clients whose owner holds no
-- lock counts as left. NULL: written before this column (waited for as before).
ALTER TABLE api_requests ADD COLUMN owner bigint;
CREATE INDEX api_requests_waited_idx ON api_requests (owner)
    WHERE state IN ('open', 'kept') AND clients > 0;
