"""Settings: their types and defaults, one frozen dataclass per table of the file.

config_load.py builds them from the TOML file and the environment (each value checked by
config_rules.py, the secrets read by config_secrets.py); with no file the defaults below
apply. Every other module reads its settings from these types.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from comfyveil import policy as policy_mod
from comfyveil.errors import ConfigError

DEFAULT_CONFIG_FILE = Path("comfyveil.toml")
DEFAULT_COMFYUI_URL = "http://127.0.0.1:8188"
DEFAULT_DAILY_QUOTA = 100  # jobs per user per UTC day
DEFAULT_MAX_QUEUED = 3  # jobs one user may have waiting or running at once
DEFAULT_COOLDOWN = 0.0  # seconds between two jobs of one user
DEFAULT_MAX_PROMPT_LENGTH = 2000  # characters
DEFAULT_MAX_IMAGE_BYTES = 20 * 1024 * 1024
DEFAULT_MAX_IMAGE_PIXELS = 40_000_000
DEFAULT_MAX_OUTPUT_BYTES = 512 * 1024 * 1024  # from a backend, per job: each file and all
DEFAULT_MAX_OUTPUTS = 64  # files one job may bring back (list)
MAX_OUTPUT_BYTES_CEILING = 1 << 30  # PostgreSQL stores an output in one bytea: 1 GiB at most
DEFAULT_JOB_RETENTION_DAYS = 7.0  # prompts, images and job rows are deleted after this
DEFAULT_LEASE_SECONDS = 30.0
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_JOB_TIMEOUT = 1800.0  # seconds a job may run on a GPU before it is failed
DEFAULT_STATUS_DELAY = 1.0  # seconds before a job's status message is posted


ROOT_DATA_DIR = Path("/var/lib/comfyveil")


def default_data_dir(
    environ: Mapping[str, str] | None = None, *, euid: int | None = None
) -> Path:
    """Where comfyveil keeps its embedded database, anon state and outputs.

    Root's default is /var/lib/comfyveil, as for a system service: in /root the embedded
    PostgreSQL could only run by opening /root to every local user (`store.embedded`).
    """
    env = os.environ if environ is None else environ
    if data_dir := env.get("COMFYVEIL_DATA_DIR"):
        return Path(data_dir).expanduser()
    if base := env.get("XDG_DATA_HOME"):
        return Path(base) / "comfyveil"
    if euid is None:
        euid = os.geteuid() if hasattr(os, "geteuid") else -1
    if euid == 0:
        return ROOT_DATA_DIR
    return Path.home() / ".local" / "share" / "comfyveil"


@dataclass(frozen=True)
class BackendConfig:
    """One ComfyUI server (usually one GPU)."""

    name: str
    url: str
    via: str = "auto"  # auto: through anon when the host is a hidden service; direct; anyone
    auth_key_file: Path | None = None  # client-authorization key of a hidden service
    tags: tuple[str, ...] = ()
    max_waiting: int = 1  # jobs queued on the backend beside the running one
    bench: Path | None = None  # a `comfyveil bench` results.json: seeds the run-time estimates
    # Leave nothing of a job on the GPU host (comfy/notrace.py): inputs and outputs in its
    # temp folder under random names, overwritten once the result is stored, the history
    # entry deleted. True is "temp"; "memory": images over the WebSocket, never on any
    # disk, but a prompt that ends while no worker holds its socket runs again.
    no_trace: bool | str = True

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"backend {self.name}: url must start with http:// or https://")
        if self.via not in {"auto", "direct", "anyone"}:
            raise ConfigError(f"backend {self.name}: via must be auto, direct or anyone")


@dataclass(frozen=True)
class DatabaseConfig:
    url: str | None = field(default=None, repr=False)  # may hold a password
    data_dir: Path | None = None  # embedded PostgreSQL lives here when url is None


@dataclass(frozen=True)
class TelegramConfig:
    token: str | None = field(default=None, repr=False)
    api_url: str | None = None  # a self-hosted Bot API server, e.g. http://127.0.0.1:8081
    admins: tuple[int, ...] = ()
    allow: tuple[int, ...] = ()  # user ids and chat ids allowed to use the bot
    open: bool = False  # anyone may use the bot
    poll_timeout: float = 30.0
    # A job's status message waits this long; a result that comes sooner arrives alone,
    # one Bot API call instead of three (post, photo, delete) under Telegram's 30/s.
    status_delay: float = DEFAULT_STATUS_DELAY


@dataclass(frozen=True)
class LimitsConfig:
    daily_quota: int = DEFAULT_DAILY_QUOTA
    max_queued: int = DEFAULT_MAX_QUEUED
    cooldown: float = DEFAULT_COOLDOWN
    max_prompt_length: int = DEFAULT_MAX_PROMPT_LENGTH
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    # What a backend may send back for one job: each file and all together, in bytes,
    # and how many files. A compromised GPU host can cost the bot this much, no more.
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    max_outputs: int = DEFAULT_MAX_OUTPUTS


@dataclass(frozen=True)
class WorkerConfig:
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    job_timeout: float = DEFAULT_JOB_TIMEOUT
    poll_interval: float = 5.0
    # "finish": each job goes where it is expected to finish first (measured speed, warm
    # models); "idle": an idle backend first, whichever it is.
    routing: str = "finish"
    max_wait_offline: float = 1800.0  # seconds a job waits while every GPU is offline
    stop_grace: float = 8.0  # seconds from SIGTERM to exit: jobs finish or go back, all closed


@dataclass(frozen=True)
class AnyoneConfig:
    enabled: bool = True  # start anon when a backend needs it
    binary: Path | None = None  # else ANON_BINARY, else what `comfyveil anon install` put
    socks: str | None = None  # "127.0.0.1:PORT" of an anon/Tor the operator runs; we start none
    control: str | None = None  # "127.0.0.1:PORT" of that daemon's control port
    cookie_file: Path | None = None
    telegram: bool = False  # route Bot API traffic through anon too
    # A private test network (a file of DirAuthority lines); unset: the public network.
    private_network: Path | None = None


@dataclass(frozen=True)
class PrivacyConfig:
    job_retention_days: float = DEFAULT_JOB_RETENTION_DAYS


@dataclass(frozen=True)
class WebConfig:
    enabled: bool = True  # `comfyveil run` serves the web front end too
    host: str = "127.0.0.1"
    port: int = 8080
    public_url: str | None = None  # how users reach it (links printed at start); else http://host:port
    session_hours: float = 7 * 24.0
    invite_hours: float = 72.0
    hidden_service: bool = False  # the managed anon publishes the web port as a hidden service
    client_auth: tuple[str, ...] = ()  # hidden-service clients (key files as `anon expose`)
    # argon2id's cost per passphrase hashed or checked (RFC 9106's second recommendation)
    passphrase_memory_mib: int = 64
    passphrase_iterations: int = 3


@dataclass(frozen=True)
class ApiConfig:
    # The images API (OpenAI's, under /v1 of the web port): on wherever the web front end
    # is, as it answers only a key an account made on purpose; off: /v1 is not there.
    enabled: bool = True
    # A request whose client went away (timeout, closed connection) waits this many
    # seconds for the client's retry to take its jobs over; then its jobs that have not
    # reached a GPU are cancelled and their quota given back.
    retry_grace: float = 30.0
    # A job of such a request that did reach a GPU runs to its end and is kept this many
    # seconds after its client left, for a retry to collect.
    retry_keep: float = 300.0
    # Webhook endpoints on loopback or private addresses are refused: a key's owner must
    # not make this server call into the network it sits in. true: allow them (a
    # receiver on the same host or LAN).
    webhook_private_targets: bool = False
    # How webhook deliveries leave: "direct", or "anon" through the Anyone client's
    # SOCKS port, so a receiver does not learn the server's address.
    webhooks_via: str = "direct"


DEFAULT_METRICS_PORT = 9464  # the port Prometheus' exporter list gives comfyveil's kind
# Names of systemd credentials (LoadCredential=NAME:FILE) read from $CREDENTIALS_DIRECTORY.
TOKEN_CREDENTIAL = "telegram-token"
DATABASE_URL_CREDENTIAL = "database-url"


@dataclass(frozen=True)
class MetricsConfig:
    enabled: bool = False  # serve /metrics, /healthz, /readyz on host:port
    host: str = "127.0.0.1"  # never the web front end's port, never a hidden service
    port: int = DEFAULT_METRICS_PORT


@dataclass(frozen=True)
class LogConfig:
    format: str = "text"  # text, or json: one object a line (journald, Loki)


@dataclass(frozen=True)
class Settings:
    data_dir: Path = field(default_factory=default_data_dir)
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    telegram: TelegramConfig = field(default_factory=TelegramConfig)
    backends: tuple[BackendConfig, ...] = ()
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    anyone: AnyoneConfig = field(default_factory=AnyoneConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    workflow_dirs: tuple[Path, ...] = ()
    web: WebConfig = field(default_factory=WebConfig)
    api: ApiConfig = field(default_factory=ApiConfig)
    policy: policy_mod.PolicyConfig = field(default_factory=policy_mod.PolicyConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    log: LogConfig = field(default_factory=LogConfig)

    @property
    def database_dir(self) -> Path:
        return self.database.data_dir or self.data_dir / "postgres"

    def backend_list(self) -> tuple[BackendConfig, ...]:
        """The configured backends, or one on ComfyUI's default local address."""
        return self.backends or (BackendConfig(name="local", url=DEFAULT_COMFYUI_URL),)
