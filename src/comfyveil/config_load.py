"""Settings: one TOML file plus environment variables, validated once at start.

The file is `--config FILE`, else `COMFYVEIL_CONFIG`, else `./comfyveil.toml` when it
exists; with none of them the defaults apply (config.py). Unknown keys are refused, so a
typo fails at start instead of being silently ignored. Secrets (the bot token) come only
from the environment or from a file whose permissions allow nobody else to read it
(config_secrets.py).
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from comfyveil import policy as policy_mod
from comfyveil.config import (
    DATABASE_URL_CREDENTIAL,
    DEFAULT_CONFIG_FILE,
    DEFAULT_STATUS_DELAY,
    TOKEN_CREDENTIAL,
    AnyoneConfig,
    ApiConfig,
    BackendConfig,
    DatabaseConfig,
    LimitsConfig,
    LogConfig,
    MetricsConfig,
    PrivacyConfig,
    Settings,
    TelegramConfig,
    WebConfig,
    WorkerConfig,
    default_data_dir,
)
from comfyveil.config_rules import checked
from comfyveil.config_secrets import check_password_closed, credential, read_secret_file
from comfyveil.errors import ConfigError


def _did_you_mean(name: str, allowed: set[str]) -> str:
    close = difflib.get_close_matches(name, sorted(allowed), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _take(table: Mapping[str, Any], section: str, allowed: set[str]) -> dict[str, Any]:
    unknown = set(table) - allowed
    if unknown:
        names = ", ".join(f"{name}{_did_you_mean(name, allowed)}" for name in sorted(unknown))
        raise ConfigError(f"unknown key(s) in [{section}]: {names}")
    return dict(table)


def _path(value: Any, base: Path) -> Path:
    path = Path(str(value)).expanduser()
    return path if path.is_absolute() else base / path


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
    top.update(checked("top level", {k: v for k, v in top.items() if k == "data_dir"}))
    data_dir = _path(top["data_dir"], base) if "data_dir" in top else default_data_dir(env)

    db = checked(
        "database", _take(top.get("database", {}), "database", {"url", "url_file", "data_dir"})
    )
    url = env.get("DATABASE_URL") or credential(DATABASE_URL_CREDENTIAL, env) or db.get("url")
    if not url and "url_file" in db:
        url = read_secret_file(_path(db["url_file"], base), "database url") or None
    database = DatabaseConfig(
        url=url,
        data_dir=_path(db["data_dir"], base) if "data_dir" in db else None,
    )

    tg = checked("telegram", _take(
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
        b = checked("backends", _take(
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

    limits = LimitsConfig(**checked(
        "limits", _take(top.get("limits", {}), "limits", set(LimitsConfig.__annotations__)),
        defaults=LimitsConfig,
    ))
    worker = WorkerConfig(**checked(
        "worker", _take(top.get("worker", {}), "worker", set(WorkerConfig.__annotations__)),
        defaults=WorkerConfig,
    ))
    an = checked("anyone", _take(
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
    privacy = PrivacyConfig(**checked(
        "privacy", _take(top.get("privacy", {}), "privacy", set(PrivacyConfig.__annotations__)),
        defaults=PrivacyConfig,
    ))
    wf = checked("workflows", _take(top.get("workflows", {}), "workflows", {"dirs"}))
    workflow_dirs = tuple(_path(d, base) for d in wf.get("dirs", []))
    metrics = MetricsConfig(**checked(
        "metrics", _take(top.get("metrics", {}), "metrics", set(MetricsConfig.__annotations__)),
        defaults=MetricsConfig,
    ))
    if metrics.host.endswith((".anon", ".anyone", ".onion")):
        raise ConfigError("[metrics] host must be a local address, never a hidden service")
    log = LogConfig(**checked(
        "log", _take(top.get("log", {}), "log", set(LogConfig.__annotations__)),
        defaults=LogConfig,
    ))
    web = _web(top.get("web", {}))
    api = ApiConfig(**checked(
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
    check_password_closed(candidate, raw)
    try:
        return from_mapping(raw, base=candidate.parent.resolve(), environ=env)
    except TypeError as exc:  # a wrong value type reaching a dataclass
        raise ConfigError(f"config file {candidate}: {exc}") from exc
