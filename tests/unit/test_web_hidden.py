"""[web] hidden_service before anon starts: the service directory, its clients, and the
proof-of-work defence only when the anon binary has that module."""

from __future__ import annotations

from pathlib import Path

import pytest

from comfyveil import config, config_load
from comfyveil.anyone import hidden as hs
from comfyveil.web import hidden


def _fake_anon(tmp_path: Path, modules: str) -> Path:
    binary = tmp_path / "anon"
    binary.write_text(f"#!/bin/sh\nprintf '{modules}'\n")
    binary.chmod(0o755)
    return binary


def _settings(tmp_path: Path, binary: Path, **web: object) -> config.Settings:
    return config_load.from_mapping(
        {
            "data_dir": str(tmp_path / "data"),
            "anyone": {"binary": str(binary)},
            "web": {"hidden_service": True, **web},
        },
        environ={},
    )


def test_pow_is_on_only_when_anon_has_the_module(tmp_path: Path) -> None:
    with_pow = _fake_anon(tmp_path, "relay: yes\\npow: yes\\n")
    prepared = hidden.prepare(_settings(tmp_path, with_pow))
    assert prepared.spec.pow_defense
    assert prepared.spec.target == "127.0.0.1:8080" and prepared.spec.port == 80
    assert prepared.spec.directory == tmp_path / "data" / "anon" / "hs" / "web"
    without = _fake_anon(tmp_path, "relay: yes\\npow: no\\n")
    assert not hidden.prepare(_settings(tmp_path, without)).spec.pow_defense


def test_clients_follow_the_configuration(tmp_path: Path) -> None:
    binary = _fake_anon(tmp_path, "pow: no\\n")
    first = hidden.prepare(_settings(tmp_path, binary, client_auth=["alice", "bob"]))
    assert set(first.new_keys) == {"alice", "bob"} and not first.revoked
    again = hidden.prepare(_settings(tmp_path, binary, client_auth=["alice"]))
    assert again.new_keys == {} and again.revoked == ["bob"]
    assert hs.client_names(again.spec.directory) == ["alice"]


def test_a_hidden_service_needs_a_fixed_port(tmp_path: Path) -> None:
    binary = _fake_anon(tmp_path, "pow: no\\n")
    with pytest.raises(config.ConfigError, match="fixed"):
        hidden.prepare(_settings(tmp_path, binary, port=0))


def test_anonrc_asks_for_the_pow_defence_of_that_service_only(
    tmp_path: Path, short_tmp_path: Path
) -> None:
    from comfyveil.anyone import network as network_mod
    from comfyveil.anyone import process

    auth = ("auth0 orport=5000 no-v2 v3ident=" + "A" * 40 + " 127.0.0.1:5001 " + "B" * 40,)
    web = hs.HiddenServiceSpec(tmp_path / "hs-web", "127.0.0.1:8080", 80, pow_defense=True)
    other = hs.HiddenServiceSpec(tmp_path / "hs-other", "127.0.0.1:8188", 80)
    anon = process.ManagedAnon(
        network=network_mod.PrivateNetwork(auth),
        binary=_fake_anon(tmp_path, ""),
        data_dir=short_tmp_path / "state",  # its sockets go in it
        hidden_services=[web, other],
    )
    lines = anon._anonrc().splitlines()
    at = lines.index("HiddenServicePort 80 127.0.0.1:8080")
    assert lines[at + 1] == "HiddenServicePoWDefensesEnabled 1"
    assert lines.count("HiddenServicePoWDefensesEnabled 1") == 1
