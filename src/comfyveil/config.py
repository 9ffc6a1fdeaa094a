"""Settings: one TOML file plus environment variables, validated once at start.

The file is `--config FILE`, else `COMFYVEIL_CONFIG`, else `./comfyveil.toml` when it
exists; with none of them the defaults below apply. Unknown keys are refused, so a typo
fails at start instead of being silently ignored. Secrets (the bot token) come only from
the environment or from a file whose permissions allow nobody else to read it.
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from comfyveil.errors import ConfigError

DEFAULT_CONFIG_FILE = Path("comfyveil.toml")
DEFAULT_COMFYUI_URL = "http://127.0.0.1:8188"
DEFAULT_DAILY_QUOTA = 100  # jobs per user per UTC day
DEFAULT_MAX_QUEUED = 3  # jobs one user may have waiting or running at once
DEFAULT_COOLDOWN = 0.0  # seconds between two jobs of one user
DEFAULT_MAX_PROMPT_LENGTH = 2000  # characters
DEFAULT_MAX_IMAGE_BYTES = 20 * 1024 * 1024
DEFAULT_MAX_IMAGE_PIXELS = 40_000_000
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


@dataclass(frozen=True)
class WorkerConfig:
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    job_timeout: float = DEFAULT_JOB_TIMEOUT
    poll_interval: float = 5.0


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

    @property
    def database_dir(self) -> Path:
        return self.database.data_dir or self.data_dir / "postgres"

    def backend_list(self) -> tuple[BackendConfig, ...]:
        """The configured backends, or one on ComfyUI's default local address."""
        return self.backends or (BackendConfig(name="local", url=DEFAULT_COMFYUI_URL),)


def _take(table: Mapping[str, Any], section: str, allowed: set[str]) -> dict[str, Any]:
    unknown = set(table) - allowed
    if unknown:
        names = ", ".join(sorted(unknown))
        raise ConfigError(f"unknown key(s) in [{section}]: {names}")
    return dict(table)


def read_secret_file(path: Path, what: str) -> str:
    """Read a secret from a file that only its owner may read."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"cannot read {what} file {path}: {exc.strerror}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{what} file {path} is readable by others; run: chmod 600 {path}")
    return path.read_text().strip()


def _path(value: Any, base: Path) -> Path:
    path = Path(str(value)).expanduser()
    return path if path.is_absolute() else base / path


def _seconds(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(f"{key} must be a number of seconds, 0 or more")
    return float(value)


def _ids(value: Any, key: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
        raise ConfigError(f"{key} must be a list of numeric Telegram ids")
    return tuple(value)


def from_mapping(
    raw: Mapping[str, Any], *, base: Path | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Build settings from a parsed TOML document and the environment."""
    env = os.environ if environ is None else environ
    base = base or Path.cwd()
    top = _take(
        raw,
        "top level",
        {"data_dir", "database", "telegram", "backends", "limits", "worker", "anyone", "privacy",
         "workflows"},
    )
    data_dir = _path(top["data_dir"], base) if "data_dir" in top else default_data_dir(env)

    db = _take(top.get("database", {}), "database", {"url", "data_dir"})
    database = DatabaseConfig(
        url=env.get("DATABASE_URL") or db.get("url"),
        data_dir=_path(db["data_dir"], base) if "data_dir" in db else None,
    )

    tg = _take(
        top.get("telegram", {}),
        "telegram",
        {"token_file", "api_url", "admins", "allow", "open", "poll_timeout", "status_delay"},
    )
    token = env.get("COMFYVEIL_TELEGRAM_TOKEN")
    if not token and "token_file" in tg:
        token = read_secret_file(_path(tg["token_file"], base), "telegram token")
    telegram = TelegramConfig(
        token=token or None,
        api_url=tg.get("api_url"),
        admins=_ids(tg.get("admins", []), "telegram.admins"),
        allow=_ids(tg.get("allow", []), "telegram.allow"),
        open=bool(tg.get("open", False)),
        poll_timeout=float(tg.get("poll_timeout", 30.0)),
        status_delay=_seconds(
            tg.get("status_delay", DEFAULT_STATUS_DELAY), "telegram.status_delay"
        ),
    )

    backends = []
    raw_backends = top.get("backends", [])
    if not isinstance(raw_backends, list):
        raise ConfigError("backends must be an array of tables: [[backends]]")
    for index, item in enumerate(raw_backends):
        b = _take(
            item, f"backends #{index + 1}",
            {"name", "url", "via", "auth_key_file", "tags", "max_waiting"},
        )
        if "url" not in b:
            raise ConfigError(f"backend #{index + 1} has no url")
        backends.append(
            BackendConfig(
                name=str(b.get("name", f"gpu{index}")),
                url=str(b["url"]).rstrip("/"),
                via=str(b.get("via", "auto")),
                auth_key_file=_path(b["auth_key_file"], base) if "auth_key_file" in b else None,
                tags=tuple(b.get("tags", ())),
                max_waiting=int(b.get("max_waiting", 1)),
            )
        )
    names = [b.name for b in backends]
    if len(set(names)) != len(names):
        raise ConfigError("two backends have the same name; give each [[backends]] its own name")

    limits = LimitsConfig(
        **_take(top.get("limits", {}), "limits", set(LimitsConfig.__annotations__))
    )
    worker = WorkerConfig(
        **_take(top.get("worker", {}), "worker", set(WorkerConfig.__annotations__))
    )
    an = _take(
        top.get("anyone", {}), "anyone",
        {"enabled", "binary", "socks", "control", "cookie_file", "telegram", "private_network"},
    )
    anyone = AnyoneConfig(
        enabled=bool(an.get("enabled", True)),
        binary=_path(an["binary"], base) if "binary" in an else (
            Path(env["ANON_BINARY"]) if env.get("ANON_BINARY") else None
        ),
        socks=an.get("socks"),
        control=an.get("control"),
        cookie_file=_path(an["cookie_file"], base) if "cookie_file" in an else None,
        telegram=bool(an.get("telegram", False)),
        private_network=(
            _path(an["private_network"], base) if "private_network" in an else None
        ),
    )
    if anyone.control and not anyone.socks:
        raise ConfigError("anyone.control needs anyone.socks: both name the daemon you run")
    if anyone.private_network and anyone.socks:
        raise ConfigError(
            "anyone.private_network and anyone.socks cannot both be set: the network is "
            "chosen by the daemon you run"
        )
    privacy = PrivacyConfig(
        **_take(top.get("privacy", {}), "privacy", set(PrivacyConfig.__annotations__))
    )
    wf = _take(top.get("workflows", {}), "workflows", {"dirs"})
    workflow_dirs = tuple(_path(d, base) for d in wf.get("dirs", []))
    return Settings(
        data_dir=data_dir,
        database=database,
        telegram=telegram,
        backends=tuple(backends),
        limits=limits,
        worker=worker,
        anyone=anyone,
        privacy=privacy,
        workflow_dirs=workflow_dirs,
    )


def load(path: Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Load settings from `path`, `COMFYVEIL_CONFIG` or `./comfyveil.toml`, if any."""
    env = os.environ if environ is None else environ
    explicit = path or (Path(env["COMFYVEIL_CONFIG"]) if env.get("COMFYVEIL_CONFIG") else None)
    candidate = explicit or DEFAULT_CONFIG_FILE
    if not candidate.exists():
        if explicit:
            raise ConfigError(f"config file {explicit} does not exist")
        return from_mapping({}, environ=env)
    try:
        raw = tomllib.loads(candidate.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {candidate} is not valid TOML: {exc}") from exc
    except TypeError as exc:
        raise ConfigError(f"config file {candidate}: {exc}") from exc
    try:
        return from_mapping(raw, base=candidate.parent.resolve(), environ=env)
    except TypeError as exc:  # a wrong value type reaching a dataclass
        raise ConfigError(f"config file {candidate}: {exc}") from exc
