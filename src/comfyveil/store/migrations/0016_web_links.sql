-- comfyveil schema, version 16: one-time links from the chat to the web front end.
--
-- `/web` in a private chat makes a short-lived link; whoever opens it (in a browser, then
-- presses the button) links a web account to that Telegram user, or logs into the
-- account already linked to it. Only the sha256 digest of the link's token is stored.
CREATE TABLE web_links (
    token_hash       bytea PRIMARY KEY,
    telegram_user_id bigint NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    expires_at       timestamptz NOT NULL
);
CREATE INDEX web_links_expires_idx ON web_links (expires_at);
