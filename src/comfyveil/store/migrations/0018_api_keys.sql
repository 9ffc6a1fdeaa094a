-- comfyveil schema: keys of the images API (/v1/), and the web state every web process
-- shares, so that several web/API processes can serve one site over one database.
--
-- An API key belongs to a web account; only the sha256 digest of the key is kept (the
-- key is 32 random bytes, so a fast hash is enough: there is nothing to guess), with the
-- last characters shown to tell keys apart.
CREATE TABLE web_api_keys (
    id            bigserial PRIMARY KEY,
    account_id    bigint NOT NULL REFERENCES web_accounts (id) ON DELETE CASCADE,
    label         text NOT NULL DEFAULT '',
    key_hash      bytea NOT NULL CONSTRAINT web_api_keys_hash_key UNIQUE,
    hint          text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz
);
CREATE INDEX web_api_keys_account_idx ON web_api_keys (account_id);

-- Random secrets every web process reads at start: the key of logged-out forms' CSRF
-- tokens and of the API's signed result links.
CREATE TABLE web_secrets (
    name        text PRIMARY KEY,
    secret      bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Failed logins of the whole site (no account, no name): the site-wide throttle counts
-- the last minute's rows, whichever process saw them.
CREATE TABLE web_login_failures (
    at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX web_login_failures_at_idx ON web_login_failures (at);
