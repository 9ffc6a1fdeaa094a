"""What each configuration key accepts: its type and, for numbers, its range, checked
once at start with a sentence naming the key when a value does not fit. The loader
(config_load.py) and the configuration reference (scripts/config_reference.py) read
RULES."""

from __future__ import annotations

import ipaddress
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from comfyveil.config import MAX_OUTPUT_BYTES_CEILING
from comfyveil.errors import ConfigError

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


def checked(
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
