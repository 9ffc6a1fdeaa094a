"""[limits] max_output_bytes and max_outputs: what a backend may send back for one job."""

from __future__ import annotations

from pathlib import Path

import pytest

from comfyveil import config_load
from comfyveil.comfy import limits
from comfyveil.errors import ConfigError


def test_defaults_are_512_mib_and_64_files() -> None:
    settings = config_load.from_mapping({}, environ={})
    assert settings.limits.max_output_bytes == 512 * 1024 * 1024
    assert settings.limits.max_outputs == 64
    assert limits.outputs(settings.limits) == limits.Limits(512 * 1024 * 1024, 64)


def test_values_from_the_file_reach_the_clients_limits(tmp_path: Path) -> None:
    cfg = tmp_path / "comfyveil.toml"
    cfg.write_text("[limits]\nmax_output_bytes = 1048576\nmax_outputs = 4\n")
    settings = config_load.load(cfg, environ={})
    assert limits.outputs(settings.limits) == limits.Limits(max_output_bytes=1 << 20, max_outputs=4)
    assert limits.outputs(settings.limits).ws_binary_bytes == (1 << 20) + limits.WS_BINARY_MARGIN


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("max_output_bytes", 0),
        ("max_output_bytes", -1),
        ("max_output_bytes", "512MiB"),
        ("max_output_bytes", 1.5),
        ("max_output_bytes", True),
        ("max_output_bytes", 2 << 30),  # more than one PostgreSQL bytea holds
        ("max_outputs", 0),
        ("max_outputs", "many"),
        ("max_outputs", 100_000),
    ],
)
def test_a_bad_value_is_refused_at_start_naming_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"^\[limits\] {key} must be a whole number from 1 to "):
        config_load.from_mapping({"limits": {key: value}}, environ={})


def test_sizes_read_as_people_write_them() -> None:
    assert limits.size_text(512 * 1024 * 1024) == "512 MiB"
    assert limits.size_text(3 * 1024 * 1024 // 2) == "1.5 MiB"
    assert limits.size_text(1 << 30) == "1 GiB"
    assert limits.size_text(300) == "300 bytes"
