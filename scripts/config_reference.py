"""The configuration reference page, generated from what the settings loader accepts.

The keys are the ones `comfyveil.config_load.from_mapping` accepts (each candidate is tried,
so a key the loader refuses never appears); what each accepts comes from
config_rules.RULES, the default from the settings' dataclasses (config.py), and the
explanation from the comments beside the key in comfyveil.example.toml. docs/hooks.py
writes the page into the site at build time, so it cannot drift from the code;
`python scripts/config_reference.py` prints it.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

from comfyveil import config, config_load, config_rules, policy

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "comfyveil.example.toml"
PAGE = "run/configuration-reference.md"

# Each table of the file, the dataclass holding its defaults (None: no dataclass).
SECTIONS: dict[str, Any] = {
    "top level": config.Settings,
    "database": config.DatabaseConfig,
    "telegram": config.TelegramConfig,
    "backends": config.BackendConfig,
    "limits": config.LimitsConfig,
    "worker": config.WorkerConfig,
    "anyone": config.AnyoneConfig,
    "privacy": config.PrivacyConfig,
    "workflows": None,
    "web": config.WebConfig,
    "api": config.ApiConfig,
    "metrics": config.MetricsConfig,
    "log": config.LogConfig,
    "policy": policy.Rules,
    "policy.commands.NAME": policy.Rules,
}
# Keys whose name in the file is not a dataclass field (the field holds what they load).
EXTRA_CANDIDATES = {
    "telegram": {"token_file"},
    "workflows": {"dirs"},
    "policy": {"spoiler_chats"},
}
# Tables of the top level, which are sections of their own, not keys.
TABLES = {name for name in SECTIONS if name not in ("top level",) and "." not in name}

_PROBE = object()  # a value no rule accepts: the loader says "unknown key" or names the key


def _attempt(section: str, key: str) -> dict[str, Any]:
    if section == "top level":
        return {key: _PROBE}
    if section == "backends":
        return {"backends": [{"url": "http://127.0.0.1:8188", key: _PROBE}]}
    if section == "policy.commands.NAME":
        return {"policy": {"commands": {"NAME": {key: _PROBE}}}}
    return {section: {key: _PROBE}}


def _accepted(section: str, key: str) -> bool:
    try:
        config_load.from_mapping(_attempt(section, key), environ={})
    except config.ConfigError as exc:
        return "unknown key" not in str(exc)
    except (TypeError, ValueError, AttributeError):
        return True  # the key got as far as its value
    return True


def _candidates(section: str) -> set[str]:
    names = set(config_rules.RULES.get(section, {}))
    holder = SECTIONS[section]
    if holder is not None:
        names |= {f.name for f in dataclasses.fields(holder)}
    names |= EXTRA_CANDIDATES.get(section, set())
    if section == "top level":
        names = {n for n in names if n not in TABLES and n not in ("workflow_dirs",)}
    return names


def accepted_keys() -> dict[str, list[str]]:
    """Every section with the keys the loader accepts in it, in the example file's order."""
    order = {(s, k): i for i, (s, k) in enumerate(example_keys())}
    keys = {}
    for section in SECTIONS:
        found = [k for k in _candidates(section) if _accepted(section, k)]
        keys[section] = sorted(found, key=lambda k: (order.get((section, k), 10**6), k))
    return keys


_SECTION_LINE = re.compile(r"^#?\s*\[\[?([a-z_.A-Z]+)\]\]?\s*$")
_KEY_LINE = re.compile(r"^#?\s?([a-z_]+)\s*=\s*(.*)$")


def _section_name(raw: str) -> str:
    return "policy.commands.NAME" if raw.startswith("policy.commands.") else raw


def example_keys() -> list[tuple[str, str]]:
    """(section, key) for every key the example file shows, set or commented out, once."""
    seen: list[tuple[str, str]] = []
    for s, k, _ in _example()[0]:
        if (s, k) not in seen:
            seen.append((s, k))
    return seen


def _inline_comment(rest: str) -> str:
    # The value may hold a "#" inside quotes; the comment starts after the value.
    in_quote = ""
    for i, ch in enumerate(rest):
        if in_quote:
            if ch == in_quote:
                in_quote = ""
        elif ch in "\"'":
            in_quote = ch
        elif ch == "#":
            return rest[i + 1 :].strip()
    return ""


def _example() -> tuple[list[tuple[str, str, str]], dict[str, str]]:
    """(section, key, explanation) from the example file's comments, and each table's
    introduction (the comment right under its header)."""
    section = "top level"
    out: list[tuple[str, str, str]] = []
    intros: dict[str, str] = {}
    block: list[str] = []  # comment lines since the last key or blank line
    after_header = False
    for line in EXAMPLE.read_text().splitlines():
        stripped = line.strip()
        if not stripped:
            block, after_header = [], False
            continue
        head = _SECTION_LINE.match(stripped)
        if head:
            section, block, after_header = _section_name(head.group(1)), [], True
            continue
        key = _KEY_LINE.match(stripped)
        if key:
            if after_header and block:
                intros.setdefault(section, " ".join(block))
                block = []
            after_header = False
            inline = _inline_comment(key.group(2))
            inline = re.sub(r"^example\b[:;,]?\s*", "", inline)  # a value shown, not the default
            out.append((section, key.group(1), inline or " ".join(block)))
            block = []
            continue
        text = stripped.lstrip("#").strip()
        continued = line.startswith(" ") or text.startswith("#")
        text = text.lstrip("#").strip()
        if out and out[-1][0] == section and continued and text:
            # A comment carried on under the last key's own, aligned with it.
            s, k, words = out[-1]
            out[-1] = (s, k, f"{words} {text}")
        elif text:
            block.append(text)
    return out, intros


def _default(section: str, key: str) -> str:
    holder = SECTIONS[section]
    if holder is None or key not in {f.name for f in dataclasses.fields(holder)}:
        return "none" if key != "dirs" else "`[]`"
    field = next(f for f in dataclasses.fields(holder) if f.name == key)
    if (section, key) == ("backends", "name"):
        return "`gpuN`, the N-th from 0"
    if field.default is dataclasses.MISSING:
        if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            return "see below" if key == "data_dir" else "`[]`"
        return "required"
    value = field.default
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        return "`[]`" if not value else f"`{list(value)}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def _accepts(section: str, key: str) -> str:
    rule = config_rules.RULES.get(section, {}).get(key)
    if rule is not None:
        return rule.describe()
    holder = SECTIONS[section]
    fields = {f.name: f for f in dataclasses.fields(holder)} if holder else {}
    default = fields[key].default if key in fields else None
    if isinstance(default, tuple) or key in ("terms", "patterns", "client_auth", "spoiler_chats"):
        return "a list"
    if isinstance(default, bool | int | float | str):
        kinds = {bool: "bool", int: "int", float: "number", str: "text"}
        return config_rules.Rule(kinds[type(default)]).describe()
    return "a text in quotes"


def markdown() -> str:
    found, intros = _example()
    words: dict[tuple[str, str], str] = {}
    for s, k, w in found:
        words[(s, k)] = words.get((s, k)) or w
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated from src/comfyveil/config*.py and comfyveil.example.toml by",
        "scripts/config_reference.py at every docs build: edit those, not this page. -->",
        "",
        "Every key comfyveil's loader accepts, by table. *Accepts* is what the loader checks",
        "(a value outside it stops comfyveil at start, naming the key); the explanation is",
        "the comment beside the key in `comfyveil.example.toml`, at the repository's root,",
        "which shows every key. [Configuration](configuration.md) says where the file is read.",
        "",
    ]
    for section, keys in accepted_keys().items():
        title = (
            "Top level"
            if section == "top level"
            else ("`[[backends]]`" if section == "backends" else f"`[{section}]`")
        )
        lines += [f"## {title}", ""]
        if section in intros:
            lines += [intros[section], ""]
        lines += ["| key | accepts | default | what it does |", "|---|---|---|---|"]
        for key in keys:
            explanation = words.get((section, key), "").replace("|", "\\|")
            lines.append(
                f"| `{key}` | {_accepts(section, key)} | {_default(section, key)} | {explanation} |"
            )
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(markdown())
