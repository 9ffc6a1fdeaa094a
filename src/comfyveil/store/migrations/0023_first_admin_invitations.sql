-- comfyveil schema: the first admin's invitation is marked, and there is at most one.
--
-- Every start without an account used to make another admin invitation: an unused one
-- from before the first account was made still opens an admin account. Those are marked
-- 'first admin' (made by nobody, before any account existed); once an account exists
-- they are closed, and before that only the newest is kept.
UPDATE web_invites SET note = 'first admin'
WHERE is_admin AND created_by IS NULL AND used_at IS NULL
  AND created_at <= coalesce((SELECT min(created_at) FROM web_accounts), 'infinity');
DELETE FROM web_invites
WHERE note = 'first admin' AND used_at IS NULL
  AND (EXISTS (SELECT 1 FROM web_accounts)
       OR token_hash <> (SELECT token_hash FROM web_invites WHERE note = 'first admin'
                         AND used_at IS NULL ORDER BY created_at DESC LIMIT 1));
