-- comfyveil schema, version 3: one catch-up delivery at a time.
--
-- A result that its own worker finished but never delivered (it crashed) is picked up by
-- the other workers' catch-up loops. Without a claim two survivors could both send it;
-- a claim row with an expiry lets exactly one try, and another try again only after the
-- claim lapsed (the claimant died too).
CREATE TABLE delivery_claims (
    job_id        uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    sink          text NOT NULL,
    claimed_by    text NOT NULL,
    claimed_until timestamptz NOT NULL,
    PRIMARY KEY (job_id, sink)
);
