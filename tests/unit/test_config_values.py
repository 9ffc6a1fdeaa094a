"""Every configuration key is checked at start: its type and range, with the key named.

Each row: where the key lives, a value at the limit (accepted), the value one past it
(refused), and the exact sentence. `job_timeout = 0` used to time every job out."""

from __future__ import annotations

from typing import Any

import pytest

from comfyveil import config_load
from comfyveil.errors import ConfigError


def _raw(section: str, key: str, value: Any) -> dict[str, Any]:
    if section == "top level":
        return {key: value}
    if section == "backends":
        return {"backends": [{"url": "http://127.0.0.1:8188", key: value}]}
    return {section: {key: value}}


ROWS: list[tuple[str, str, Any, Any, str]] = [
    # section, key, accepted at the limit, refused one past it, message
    ("worker", "job_timeout", 0.001, 0, "[worker] job_timeout must be a number > 0, got 0"),
    ("worker", "lease_seconds", 0.5, 0.0, "[worker] lease_seconds must be a number > 0, got 0.0"),
    ("worker", "poll_interval", 0.01, -1, "[worker] poll_interval must be a number > 0, got -1"),
    ("worker", "max_attempts", 1, 0, "[worker] max_attempts must be a whole number >= 1, got 0"),
    (
        "worker",
        "max_attempts",
        3,
        2.5,
        "[worker] max_attempts must be a whole number >= 1, got 2.5",
    ),
    ("worker", "job_timeout", 1800, "30m", '[worker] job_timeout must be a number > 0, got "30m"'),
    ("limits", "daily_quota", 0, -1, "[limits] daily_quota must be a whole number >= 0, got -1"),
    ("limits", "max_queued", 1, 0, "[limits] max_queued must be a whole number >= 1, got 0"),
    ("limits", "cooldown", 0, -0.5, "[limits] cooldown must be a number >= 0, got -0.5"),
    ("limits", "cooldown", 2.5, True, "[limits] cooldown must be a number >= 0, got true"),
    (
        "limits",
        "max_prompt_length",
        1,
        0,
        "[limits] max_prompt_length must be a whole number >= 1, got 0",
    ),
    (
        "limits",
        "max_image_bytes",
        1,
        0,
        "[limits] max_image_bytes must be a whole number >= 1, got 0",
    ),
    (
        "limits",
        "max_image_pixels",
        1,
        0,
        "[limits] max_image_pixels must be a whole number >= 1, got 0",
    ),
    (
        "privacy",
        "job_retention_days",
        0.01,
        0,
        "[privacy] job_retention_days must be a number > 0, got 0",
    ),
    ("telegram", "poll_timeout", 0, -1, "[telegram] poll_timeout must be a number >= 0, got -1"),
    (
        "telegram",
        "status_delay",
        0,
        -0.1,
        "[telegram] status_delay must be a number >= 0, got -0.1",
    ),
    ("telegram", "open", True, 1, "[telegram] open must be true or false, got 1"),
    ("telegram", "open", False, "yes", '[telegram] open must be true or false, got "yes"'),
    (
        "telegram",
        "admins",
        [1, -100],
        ["me"],
        '[telegram] admins must be a list of numeric Telegram ids, got ["me"]',
    ),
    ("telegram", "allow", [], 5, "[telegram] allow must be a list of numeric Telegram ids, got 5"),
    (
        "telegram",
        "api_url",
        "http://127.0.0.1:8081",
        8081,
        "[telegram] api_url must be a text in quotes, got 8081",
    ),
    (
        "backends",
        "max_waiting",
        0,
        -1,
        "[[backends]] #1 max_waiting must be a whole number from 0 to 1000, got -1",
    ),
    (
        "backends",
        "max_waiting",
        1000,
        1001,
        "[[backends]] #1 max_waiting must be a whole number from 0 to 1000, got 1001",
    ),
    (
        "backends",
        "via",
        "anyone",
        "tor",
        '[[backends]] #1 via must be one of auto, direct, anyone, got "tor"',
    ),
    (
        "backends",
        "tags",
        ["big"],
        "big",
        '[[backends]] #1 tags must be a list of texts in quotes, got "big"',
    ),
    ("backends", "name", "gpu0", 0, "[[backends]] #1 name must be a text in quotes, got 0"),
    ("anyone", "enabled", True, "no", '[anyone] enabled must be true or false, got "no"'),
    ("anyone", "telegram", False, 0, "[anyone] telegram must be true or false, got 0"),
    ("anyone", "binary", "/opt/anon", 1, "[anyone] binary must be a text in quotes, got 1"),
    (
        "workflows",
        "dirs",
        ["flows"],
        "flows",
        '[workflows] dirs must be a list of texts in quotes, got "flows"',
    ),
    ("top level", "data_dir", "state", 1, "data_dir must be a text in quotes, got 1"),
]


@pytest.mark.parametrize(
    ("section", "key", "good", "bad", "message"),
    ROWS,
    ids=[f"{r[0]}.{r[1]}={r[3]!r}" for r in ROWS],
)
def test_each_key_accepts_its_limit_and_refuses_one_past_it(
    section: str, key: str, good: Any, bad: Any, message: str
) -> None:
    config_load.from_mapping(_raw(section, key, good), environ={})
    with pytest.raises(ConfigError) as refused:
        config_load.from_mapping(_raw(section, key, bad), environ={})
    assert str(refused.value) == message


ENDPOINTS = [
    ("127.0.0.1:1", True),
    ("127.0.0.1:65535", True),
    ("127.0.0.1:0", False),
    ("127.0.0.1:65536", False),
    ("[::1]:9050", True),
    ("[::1x]:9050", False),
    ("anon.internal:9050", True),
    ("9050", False),
    (":9050", False),
    ("bad host:9050", False),
    ("999.1.1.1:9050", False),
    ("unix:/run/anon/socks", True),
    ("unix:~/anon/socks", True),
    ("unix:relative", False),
]


@pytest.mark.parametrize(("value", "accepted"), ENDPOINTS)
@pytest.mark.parametrize("key", ["socks", "control"])
def test_anon_endpoints_are_host_and_port(key: str, value: str, accepted: bool) -> None:
    raw = {"anyone": {"socks": "127.0.0.1:9050", key: value}}
    if accepted:
        config_load.from_mapping(raw, environ={})
        return
    with pytest.raises(ConfigError) as refused:
        config_load.from_mapping(raw, environ={})
    assert str(refused.value) == (
        f"[anyone] {key} must be HOST:PORT with a port from 1 to 65535 (e.g. 127.0.0.1:9050) "
        f'or unix:/PATH, got "{value}"'
    )


def test_the_database_url_is_never_echoed() -> None:
    with pytest.raises(ConfigError) as refused:
        config_load.from_mapping({"database": {"url": 5}}, environ={})
    assert str(refused.value) == "[database] url must be a text in quotes"


def test_a_section_that_is_not_a_table_is_named() -> None:
    with pytest.raises(ConfigError, match=r"worker must be a table: \[worker\]"):
        config_load.from_mapping({"worker": 5}, environ={})


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("127.0.0.1:0", "its port is not a number from 1 to 65535"),
        ("127.0.0.1:65536", "its port is not a number from 1 to 65535"),
        ("127.0.0.1", "it has no HOST:PORT form"),
        ("-bad-:8188", "its host is not an IP address or a host name"),
        ("8188", "it has no HOST:PORT form"),
        ("comfy.lan:8188", "its host is not an IP address (anon resolves no names there)"),
        ("127.0.0.1:8188 ; rm", "its port is not a number from 1 to 65535"),
    ],
)
def test_anon_expose_target_must_be_an_ip_and_a_port(value: str, problem: str) -> None:
    from comfyveil.cli import anon
    from comfyveil.errors import UsageError

    with pytest.raises(UsageError) as refused:
        anon._target(value)
    assert str(refused.value) == f"--target must look like 127.0.0.1:8188: {problem} ({value!r})"


def test_anon_expose_target_at_the_port_limits_and_off_loopback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from comfyveil.cli import anon

    assert anon._target("127.0.0.1:1") == "127.0.0.1:1"
    assert anon._target("localhost:65535") == "127.0.0.1:65535"
    assert anon._target("[::1]:8188") == "[::1]:8188"
    assert capsys.readouterr().err == ""
    assert anon._target("192.168.1.5:8188") == "192.168.1.5:8188"
    assert "not on this machine's loopback" in capsys.readouterr().err
