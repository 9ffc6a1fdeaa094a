-- comfyveil schema, version 15: accounts of the web front end.
--
-- A web account is a user of the same store as a Telegram user: its jobs carry its
-- `user_id`, so queue, fairness, quotas, retention and forgetting are shared. A new
-- account gets a user id of its own, below -2^62 (Telegram's ids, users' and chats', all
-- lie within +-2^53), so it can never collide with a Telegram id; linking it to a
-- Telegram user later only changes `user_id`. Its jobs use `chat_id` = the same number
-- (see comfyveil/web/identity.py), which is how the Telegram sink knows to leave them.
--
-- Invitations, sessions and one-time login links store only sha256 digests of their
-- tokens: whoever reads the database cannot log in with what it finds there.
CREATE SEQUENCE web_account_seq;

CREATE TABLE web_accounts (
    id              bigint PRIMARY KEY DEFAULT nextval('web_account_seq'),
    name            text NOT NULL,
    name_key        text NOT NULL CONSTRAINT web_accounts_name_key UNIQUE,  -- lower(name)
    passphrase      text NOT NULL,                         -- argon2id hash
    user_id         bigint NOT NULL CONSTRAINT web_accounts_user_key UNIQUE,
    chat_id         bigint NOT NULL,
    is_admin        boolean NOT NULL DEFAULT false,
    disabled        boolean NOT NULL DEFAULT false,        -- banned from the web front end
    failed_logins   integer NOT NULL DEFAULT 0,
    locked_until    timestamptz,                           -- failed logins slow the next one
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_login_at   timestamptz
);

CREATE TABLE web_invites (
    token_hash  bytea PRIMARY KEY,
    is_admin    boolean NOT NULL DEFAULT false,
    created_by  bigint REFERENCES web_accounts (id) ON DELETE SET NULL,
    note        text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    used_at     timestamptz,
    used_by     bigint REFERENCES web_accounts (id) ON DELETE SET NULL
);

CREATE TABLE web_sessions (
    token_hash  bytea PRIMARY KEY,
    account_id  bigint NOT NULL REFERENCES web_accounts (id) ON DELETE CASCADE,
    csrf        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX web_sessions_account_idx ON web_sessions (account_id);
CREATE INDEX web_sessions_expires_idx ON web_sessions (expires_at);
