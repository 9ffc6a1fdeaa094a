-- comfyveil schema, version 14: how many prompts the content policy refused.
--
-- Counts only, per UTC day and command: never the prompt, the user or the matched term, so
-- an admin's /policy shows how often the policy bites without keeping what was written.
CREATE TABLE policy_refusals (
    day     date   NOT NULL,
    command text   NOT NULL,
    refused bigint NOT NULL DEFAULT 0 CHECK (refused >= 0),
    PRIMARY KEY (day, command)
);
