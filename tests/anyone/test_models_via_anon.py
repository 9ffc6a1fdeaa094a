"""`comfyveil models install --via-anon` with our own anon on the private Anyone network:
the download reaches the fake hub through an exit relay, and this process never opens a
connection to the hub itself."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.fixtures.anyone import PrivateAnyoneNetwork
from tests.integration.test_models_install import (  # noqa: F401 (fixtures)
    comfyui,
    hub,
    make_workflow,
    placed,
    run,
)


@pytest.mark.anyone
@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_install_via_anon_reaches_the_hub_only_through_the_anyone_network(
    anyone_network: PrivateAnyoneNetwork, hub, comfyui: Path, tmp_path: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    assert anyone_network.network is not None
    net_file = tmp_path / "private-network.txt"
    net_file.write_text(anyone_network.network.to_file_text())
    settings = tmp_path / "comfyveil.toml"
    settings.write_text(
        f'data_dir = "{tmp_path / "data"}"\n\n'
        f'[anyone]\nbinary = "{anyone_network.binary}"\nprivate_network = "{net_file}"\n'
    )
    toml, (ckpt, vae) = make_workflow(tmp_path / "wf", hub)
    dialled: list[object] = []
    guarded = socket.socket.connect

    def recording(self: socket.socket, address: object) -> object:
        dialled.append(address)
        return guarded(self, address)

    monkeypatch.setattr(socket.socket, "connect", recording)

    code = await run("install", str(toml), "--comfyui-dir", str(comfyui), "--via-anon",
                     "--config", str(settings))

    assert code == 0, capsys.readouterr().err[-2000:]
    assert placed(comfyui, "checkpoints", ckpt).read_bytes() == ckpt.data
    assert placed(comfyui, "vae", vae).read_bytes() == vae.data
    assert hub.requests  # the exit relay brought them
    ports = {a[1] for a in dialled if isinstance(a, tuple) and len(a) >= 2}
    assert hub.port not in ports and hub.cdn_port not in ports
