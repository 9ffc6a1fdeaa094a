-- comfyveil schema, version 11: a result answers the message that asked for it.
--
-- In a group two users' results looked alike and came unattached. The chat message that
-- queued a job (`request_message_id`, the result replies to it) and, in groups, the name
-- of who asked (`requested_by`, shown in the caption) are kept with the job, so a result
-- delivered by another process or after a restart is tied to its request too. Both go
-- with the job (/forget deletes them).
ALTER TABLE jobs ADD COLUMN request_message_id bigint, ADD COLUMN requested_by text;
