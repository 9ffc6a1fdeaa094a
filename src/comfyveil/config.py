"""Settings: one TOML file plus environment variables, validated once at start.

The file is `--config FILE`, else `COMFYVEIL_CONFIG`, else `./comfyveil.toml` when it
exists; with none of them the defaults below apply. Unknown keys are refused, so a typo
fails at start instead of being silently ignored. Secrets (the bot token) come only from
the environment or from a file whose permissions allow nobody else to read it.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import os
import re
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


def _did_you_mean(name: str, allowed: set[str]) -> str:
    close = difflib.get_close_matches(name, sorted(allowed), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _take(table: Mapping[str, Any], section: str, allowed: set[str]) -> dict[str, Any]:
    unknown = set(table) - allowed
    if unknown:
        names = ", ".join(f"{name}{_did_you_mean(name, allowed)}" for name in sorted(unknown))
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


def credential(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """A systemd credential (`LoadCredential=NAME:FILE` in the unit), else None.

    systemd puts it in $CREDENTIALS_DIRECTORY, readable by the service alone and never in
    its environment (which other processes of the user could read in /proc).
    """
    env = os.environ if environ is None else environ
    directory = env.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return None
    path = Path(directory) / name
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read the {name} credential: {exc.strerror}") from exc


def _path(value: Any, base: Path) -> Path:
    path = Path(str(value)).expanduser()
    return path if path.is_absolute() else base / path


# --- checking each value ------------------------------------------------------------------
# Every key has a rule: its type and, for numbers, its range. A value outside it stops
# the start with a sentence naming the key ("[worker] job_timeout must be a number > 0,
# got 0"), where a silent zero would fail every job later. A key added to a section
# without a rule here is checked against its default's type.


def _shown(value: Any) -> str:
    """A value as the TOML file spells it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value) if not isinstance(value, list | dict) else json.dumps(value)


@dataclass(frozen=True)
class Rule:
    """What one key accepts. kind: int, number, bool, text, ids (a list of Telegram ids),
    texts (a list of text), endpoint (HOST:PORT); low/high bound numbers, `above` makes
    the low bound exclusive; secret: never echo the value."""

    kind: str
    low: float | None = None
    high: float | None = None
    above: bool = False
    choices: tuple[str, ...] = ()
    secret: bool = False

    def describe(self) -> str:
        if self.kind in ("int", "number"):
            what = "a whole number" if self.kind == "int" else "a number"
            if self.low is not None and self.high is not None:
                return f"{what} from {_num(self.low)} to {_num(self.high)}"
            if self.low is not None:
                return f"{what} {'>' if self.above else '>='} {_num(self.low)}"
            return what
        return {
            "bool": "true or false" if not self.choices else
                    "true, false, " + ", ".join(f'"{c}"' for c in self.choices),
            "text": "a text in quotes" if not self.choices else
                    "one of " + ", ".join(self.choices),
            "ids": "a list of numeric Telegram ids",
            "texts": "a list of texts in quotes",
            "endpoint": "HOST:PORT with a port from 1 to 65535 (e.g. 127.0.0.1:9050) "
                        "or unix:/PATH",
        }[self.kind]

    def check(self, label: str, value: Any) -> Any:
        """`value` as the settings hold it; ConfigError naming `label` when it does not fit."""
        ok = True
        if self.kind in ("int", "number"):
            allowed = int if self.kind == "int" else int | float
            ok = isinstance(value, allowed) and not isinstance(value, bool)
            if ok and self.low is not None:
                ok = value > self.low if self.above else value >= self.low
            if ok and self.high is not None:
                ok = value <= self.high
            if ok and self.kind == "number":
                ok = math.isfinite(value)
                value = float(value)
        elif self.kind == "bool":
            ok = isinstance(value, bool) or (isinstance(value, str) and value in self.choices)
        elif self.kind == "text":
            ok = isinstance(value, str) and (not self.choices or value in self.choices)
        elif self.kind == "ids":
            ok = isinstance(value, list) and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value)
            value = tuple(value) if ok else value
        elif self.kind == "texts":
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            value = tuple(value) if ok else value
        elif self.kind == "endpoint":
            ok = isinstance(value, str) and endpoint_problem(value, unix_ok=True) is None
        if not ok:
            got = "" if self.secret else f", got {_shown(value)}"
            raise ConfigError(f"{label} must be {self.describe()}{got}")
        return value


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def endpoint_problem(value: str, *, unix_ok: bool = False) -> str | None:
    """Why `value` is not a usable HOST:PORT (None: it is); with `unix_ok`, a
    `unix:/absolute/path` socket is fine too. Also for `anon expose --target`."""
    if unix_ok and value.startswith("unix:"):
        return None if value[5:].startswith(("/", "~")) else "its unix: path is not absolute"
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        return "it has no HOST:PORT form"
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return "its port is not a number from 1 to 65535"
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return "its host is not an IPv6 address"
        return None
    try:
        ipaddress.IPv4Address(host)
        return None
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    if len(host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        return "its host is not an IP address or a host name"
    if all(label.isdigit() for label in labels):
        return "its host is not an IP address or a host name"
    return None


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")

_TEXT = Rule("text")
_BOOL = Rule("bool")
_SECONDS = Rule("number", low=0)  # 0: none
_POSITIVE_SECONDS = Rule("number", low=0, above=True)

RULES: dict[str, dict[str, Rule]] = {
    "top level": {"data_dir": _TEXT},
    "database": {"url": Rule("text", secret=True), "url_file": _TEXT, "data_dir": _TEXT},
    "telegram": {
        "token_file": _TEXT, "api_url": _TEXT, "admins": Rule("ids"), "allow": Rule("ids"),
        "open": _BOOL, "poll_timeout": _SECONDS, "status_delay": _SECONDS,
    },
    "backends": {
        "name": _TEXT, "url": _TEXT, "via": Rule("text", choices=("auto", "direct", "anyone")),
        "auth_key_file": _TEXT, "tags": Rule("texts"),
        "max_waiting": Rule("int", low=0, high=1000), "bench": _TEXT,
        "no_trace": Rule("bool", choices=("temp", "memory")),
    },
    "limits": {
        "daily_quota": Rule("int", low=0), "max_queued": Rule("int", low=1),
        "cooldown": _SECONDS, "max_prompt_length": Rule("int", low=1),
        "max_image_bytes": Rule("int", low=1), "max_image_pixels": Rule("int", low=1),
        "max_output_bytes": Rule("int", low=1, high=MAX_OUTPUT_BYTES_CEILING),
        "max_outputs": Rule("int", low=1, high=10_000),
    },
    "worker": {
        "lease_seconds": _POSITIVE_SECONDS, "max_attempts": Rule("int", low=1),
        "job_timeout": _POSITIVE_SECONDS, "poll_interval": _POSITIVE_SECONDS,
        "routing": Rule("text", choices=("finish", "idle")),
        "max_wait_offline": _POSITIVE_SECONDS, "stop_grace": _SECONDS,
    },
    "anyone": {
        "enabled": _BOOL, "binary": _TEXT, "socks": Rule("endpoint"),
        "control": Rule("endpoint"), "cookie_file": _TEXT, "telegram": _BOOL,
        "private_network": _TEXT,
    },
    "privacy": {"job_retention_days": _POSITIVE_SECONDS},
    "workflows": {"dirs": Rule("texts")},
    "api": {
        "enabled": _BOOL, "retry_grace": _SECONDS, "retry_keep": _SECONDS,
        "webhook_private_targets": _BOOL,
        "webhooks_via": Rule("text", choices=("direct", "anon")),
    },
    "metrics": {
        "enabled": _BOOL, "host": _TEXT, "port": Rule("int", low=0, high=65535),
    },
    "log": {"format": Rule("text", choices=("text", "json"))},
}


def _rule_for_default(default: Any) -> Rule:
    if isinstance(default, bool):
        return _BOOL
    if isinstance(default, int):
        return Rule("int")
    if isinstance(default, float):
        return Rule("number")
    return _TEXT


def _checked(
    section: str, table: dict[str, Any], *, label: str | None = None,
    defaults: type | None = None,
) -> dict[str, Any]:
    """`table` with each value checked against its rule (see RULES)."""
    rules = RULES.get(section, {})
    prefix = label or ("" if section == "top level" else f"[{section}] ")
    fields = getattr(defaults, "__dataclass_fields__", {})
    checked = {}
    for key, value in table.items():
        rule = rules.get(key)
        if rule is None and key in fields:
            rule = _rule_for_default(fields[key].default)
        checked[key] = rule.check(f"{prefix}{key}", value) if rule is not None else value
    return checked


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
         "workflows", "web", "api",
         "policy", "metrics", "log"},
    )
    for name in ("database", "telegram", "limits", "worker", "anyone", "privacy", "workflows",
                 "api", "metrics", "log"):
        if not isinstance(top.get(name, {}), dict):
            raise ConfigError(f"{name} must be a table: [{name}]")
    top.update(_checked("top level", {k: v for k, v in top.items() if k == "data_dir"}))
    data_dir = _path(top["data_dir"], base) if "data_dir" in top else default_data_dir(env)

    db = _checked(
        "database", _take(top.get("database", {}), "database", {"url", "url_file", "data_dir"})
    )
    url = env.get("DATABASE_URL") or credential(DATABASE_URL_CREDENTIAL, env) or db.get("url")
    if not url and "url_file" in db:
        url = read_secret_file(_path(db["url_file"], base), "database url") or None
    database = DatabaseConfig(
        url=url,
        data_dir=_path(db["data_dir"], base) if "data_dir" in db else None,
    )

    tg = _checked("telegram", _take(
        top.get("telegram", {}),
        "telegram",
        {"token_file", "api_url", "admins", "allow", "open", "poll_timeout", "status_delay"},
    ))
    token = env.get("COMFYVEIL_TELEGRAM_TOKEN") or credential(TOKEN_CREDENTIAL, env)
    if not token and "token_file" in tg:
        token = read_secret_file(_path(tg["token_file"], base), "telegram token")
    telegram = TelegramConfig(
        token=token or None,
        api_url=tg.get("api_url"),
        admins=tg.get("admins", ()),
        allow=tg.get("allow", ()),
        open=tg.get("open", False),
        poll_timeout=tg.get("poll_timeout", 30.0),
        status_delay=tg.get("status_delay", DEFAULT_STATUS_DELAY),
    )

    backends = []
    raw_backends = top.get("backends", [])
    if not isinstance(raw_backends, list):
        raise ConfigError("backends must be an array of tables: [[backends]]")
    for index, item in enumerate(raw_backends):
        if not isinstance(item, dict):
            raise ConfigError("backends must be an array of tables: [[backends]]")
        b = _checked("backends", _take(
            item, f"backends #{index + 1}",
            {"name", "url", "via", "auth_key_file", "tags", "max_waiting", "bench",
             "no_trace"},
        ), label=f"[[backends]] #{index + 1} ")
        if "url" not in b:
            raise ConfigError(f"backend #{index + 1} has no url")
        backends.append(
            BackendConfig(
                name=str(b.get("name", f"gpu{index}")),
                url=str(b["url"]).rstrip("/"),
                via=str(b.get("via", "auto")),
                auth_key_file=_path(b["auth_key_file"], base) if "auth_key_file" in b else None,
                tags=b.get("tags", ()),
                max_waiting=b.get("max_waiting", 1),
                bench=_path(b["bench"], base) if "bench" in b else None,
                no_trace=True if b.get("no_trace", True) == "temp" else b.get("no_trace", True),
            )
        )
    names = [b.name for b in backends]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"two backends are named {', '.join(twice)}; give each [[backends]] "
                          "its own name (one is gpuN when it has none: the N-th from 0)")

    limits = LimitsConfig(**_checked(
        "limits", _take(top.get("limits", {}), "limits", set(LimitsConfig.__annotations__)),
        defaults=LimitsConfig,
    ))
    worker = WorkerConfig(**_checked(
        "worker", _take(top.get("worker", {}), "worker", set(WorkerConfig.__annotations__)),
        defaults=WorkerConfig,
    ))
    an = _checked("anyone", _take(
        top.get("anyone", {}), "anyone",
        {"enabled", "binary", "socks", "control", "cookie_file", "telegram", "private_network"},
    ), defaults=AnyoneConfig)
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
        raise ConfigError("[anyone] control needs [anyone] socks: both name the daemon you run")
    if anyone.private_network and anyone.socks:
        raise ConfigError(
            "[anyone] private_network and [anyone] socks cannot both be set: the network is "
            "chosen by the daemon you run"
        )
    privacy = PrivacyConfig(**_checked(
        "privacy", _take(top.get("privacy", {}), "privacy", set(PrivacyConfig.__annotations__)),
        defaults=PrivacyConfig,
    ))
    wf = _checked("workflows", _take(top.get("workflows", {}), "workflows", {"dirs"}))
    workflow_dirs = tuple(_path(d, base) for d in wf.get("dirs", []))
    metrics = MetricsConfig(**_checked(
        "metrics", _take(top.get("metrics", {}), "metrics", set(MetricsConfig.__annotations__)),
        defaults=MetricsConfig,
    ))
    if metrics.host.endswith((".anon", ".anyone", ".onion")):
        raise ConfigError("[metrics] host must be a local address, never a hidden service")
    log = LogConfig(**_checked(
        "log", _take(top.get("log", {}), "log", set(LogConfig.__annotations__)),
        defaults=LogConfig,
    ))
    web = _web(top.get("web", {}))
    api = ApiConfig(**_checked(
        "api", _take(top.get("api", {}), "api", set(ApiConfig.__annotations__)),
        defaults=ApiConfig,
    ))
    if metrics.enabled and web.enabled and metrics.port and (metrics.host, metrics.port) == (
        web.host, web.port
    ):
        raise ConfigError(
            "[metrics] port and [web] port are the same; the metrics need their own port"
        )
    return Settings(
        metrics=metrics,
        log=log,
        web=web,
        api=api,
        data_dir=data_dir,
        database=database,
        telegram=telegram,
        backends=tuple(backends),
        limits=limits,
        worker=worker,
        anyone=anyone,
        privacy=privacy,
        workflow_dirs=workflow_dirs,
        policy=policy_mod.from_table(top.get("policy")),
    )


def _web(raw: Any) -> WebConfig:
    w = _take(raw, "web", set(WebConfig.__annotations__))
    port = w.get("port", 8080)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError("[web] port must be a port number (1-65535; 0: any free port)")
    clients = w.get("client_auth", [])
    if not isinstance(clients, list) or not all(
        isinstance(c, str) and c and len(c) <= 64 and c.replace("-", "").replace("_", "").isalnum()
        and c.isascii() for c in clients
    ):
        raise ConfigError("[web] client_auth must be a list of client names (letters, digits, - _)")
    for key in ("session_hours", "invite_hours"):
        value = w.get(key, 1.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(f"[web] {key} must be a number of hours above 0")
    for key, most in (("passphrase_memory_mib", 4096), ("passphrase_iterations", 64)):
        value = w.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise ConfigError(f"[web] {key} must be a whole number from 1 to {most}")
    defaults = WebConfig()
    return WebConfig(
        enabled=bool(w.get("enabled", defaults.enabled)),
        host=str(w.get("host", defaults.host)),
        port=port,
        public_url=str(w["public_url"]).rstrip("/") if w.get("public_url") else None,
        session_hours=float(w.get("session_hours", defaults.session_hours)),
        invite_hours=float(w.get("invite_hours", defaults.invite_hours)),
        hidden_service=bool(w.get("hidden_service", defaults.hidden_service)),
        client_auth=tuple(clients),
        passphrase_memory_mib=w.get("passphrase_memory_mib", defaults.passphrase_memory_mib),
        passphrase_iterations=w.get("passphrase_iterations", defaults.passphrase_iterations),
    )


def has_password(url: str) -> bool:
    """Whether a PostgreSQL connection string (URL or key=value) holds a password."""
    import psycopg.conninfo  # here: the settings load in commands that never connect

    try:
        return bool(psycopg.conninfo.conninfo_to_dict(url).get("password"))
    except psycopg.ProgrammingError:
        return "password" in url.lower() or "@" in url  # unparsable: assume the worst


def _check_password_closed(path: Path, raw: Mapping[str, Any]) -> None:
    """Refuse a database password in a settings file other users can read (as a token
    file with group or other bits is refused).

    Raises:
        ConfigError: what to do instead, in one sentence.
    """
    table = raw.get("database")
    url = table.get("url") if isinstance(table, Mapping) else None
    if not isinstance(url, str) or not has_password(url):
        return
    if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"config file {path} holds a database password and other users can read it: "
            f"run chmod 600 {path}, or move the URL to [database] url_file (a file only "
            "you can read) or to the systemd credential database-url (LoadCredential=)"
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
    _check_password_closed(candidate, raw)
    try:
        return from_mapping(raw, base=candidate.parent.resolve(), environ=env)
    except TypeError as exc:  # a wrong value type reaching a dataclass
        raise ConfigError(f"config file {candidate}: {exc}") from exc
