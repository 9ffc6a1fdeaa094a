"""`comfyveil models install/check` against a fake Hugging Face hub (tests/fakes/hf_hub.py)
through the real huggingface_hub code (HEAD metadata, redirect, GET with Range, retries):
tiny files of a few KB stand in for the real ones, listed by a test workflow's NAME.toml."""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import constants
from huggingface_hub.utils import _detect_agent as hf_detect_agent

from comfyveil import cli, logs, redaction
from comfyveil.errors import ComfyveilError, ConfigError, UsageError
from comfyveil.models import local
from tests.fakes.hf_hub import FakeFile, FakeHub
from tests.fakes.socks_relay import SocksRelay

REPO = "Comfy-Org/tiny_models"
TOKEN = "hf_" + "Tk9" * 12  # the shape of a Hugging Face token


@pytest.fixture
async def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> AsyncIterator[FakeHub]:
    fake = await FakeHub().start()
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    for name in ("HF_TOKEN", "HF_HOME", "HF_HUB_OFFLINE", "HTTP_PROXY", "HTTPS_PROXY",
                 "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    # http_get keeps what it got in whole chunks (10 MiB): 1000 bytes stand in for them
    # as files of a few KB stand in for GB, so a cut mid-file keeps something.
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 1000)
    yield fake
    await fake.close()


@pytest.fixture
def comfyui(tmp_path: Path) -> Path:
    root = tmp_path / "ComfyUI"
    (root / "models" / "checkpoints").mkdir(parents=True)
    return root


def make_workflow(
    folder: Path, hub: FakeHub, *, pinned: bool = True
) -> tuple[Path, list[FakeFile]]:
    """A workflow loading a checkpoint and a VAE, with [[models]] tables for both."""
    ckpt = hub.add(REPO, "tiny_ckpt.safetensors", secrets.token_bytes(6000))
    vae = hub.add(REPO, "split_files/vae/tiny_vae.safetensors", secrets.token_bytes(3000),
                  commit=ckpt.commit)
    graph = {
        "4": {"class_type": "CheckpointLoaderSimple",
              "inputs": {"ckpt_name": "tiny_ckpt.safetensors"}},
        "5": {"class_type": "VAELoader", "inputs": {"vae_name": "tiny_vae.safetensors"}},
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny.json").write_text(json.dumps(graph))
    tables = ""
    for item, where in ((ckpt, "checkpoints"), (vae, "vae")):
        revision = f'revision = "{item.commit}"\n' if pinned else ""
        tables += (f'\n[[models]]\nrepo = "{item.repo}"\npath = "{item.path}"\n{revision}'
                   f'folder = "{where}"\nsize = {item.size}\nsha256 = "{item.sha256}"\n')
    toml = folder / "tiny.toml"
    toml.write_text(f'command = "tiny"\ntitle = "Tiny"\n{tables}')
    return toml, [ckpt, vae]


async def run(*argv: str) -> int:
    """What `comfyveil models ...` does, in this event loop (main() would start one)."""
    args = cli.build_parser(only="models").parse_args(["models", *argv])
    try:
        return int(await args.handler(args) or 0)
    except (UsageError, ConfigError) as exc:
        print(f"comfyveil: {exc}", file=sys.stderr)
        return cli.EXIT_USAGE
    except ComfyveilError as exc:
        print(f"comfyveil: {exc}", file=sys.stderr)
        return cli.EXIT_FAILURE


def placed(comfyui: Path, folder: str, item: FakeFile) -> Path:
    return comfyui / "models" / folder / Path(item.path).name


def leftovers(comfyui: Path) -> list[str]:
    return [p.name for p in (comfyui / "models").rglob("*") if p.name.startswith(".")]


async def test_install_from_nothing_places_verified_files_at_the_pinned_commit(
    hub: FakeHub, comfyui: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml, (ckpt, vae) = make_workflow(tmp_path / "wf", hub)

    assert await run("install", str(toml), "--comfyui-dir", str(comfyui)) == 0

    assert placed(comfyui, "checkpoints", ckpt).read_bytes() == ckpt.data
    assert placed(comfyui, "vae", vae).read_bytes() == vae.data  # vae/ made on the way
    assert leftovers(comfyui) == []
    assert "installed the 2 model files of /tiny" in capsys.readouterr().out
    resolves = [r for r in hub.requests if "/resolve/" in r.path]
    assert resolves and all(f"/resolve/{ckpt.commit}/" in r.path for r in resolves)
    assert hub.sent[ckpt.sha256] == ckpt.size and hub.sent[vae.sha256] == vae.size

    assert await run("check", str(toml), "--comfyui-dir", str(comfyui), "--verify") == 0
    out = capsys.readouterr().out
    assert "all 2 files in place" in out and out.count("sha256 ok") == 2


async def test_second_run_downloads_nothing_and_says_so(
    hub: FakeHub, comfyui: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml, _files = make_workflow(tmp_path / "wf", hub)
    assert await run("install", str(toml), "--comfyui-dir", str(comfyui), "--quiet") == 0
    assert capsys.readouterr().out == ""  # --quiet: nothing for a script to parse
    asked = len(hub.requests)

    assert await run("install", str(toml), "--comfyui-dir", str(comfyui)) == 0

    assert len(hub.requests) == asked  # not even a HEAD
    assert "nothing to do: the 2 model files of /tiny are in place" in capsys.readouterr().out


async def test_a_cut_download_resumes_without_fetching_the_first_part_again(
    hub: FakeHub, comfyui: Path, tmp_path: Path
) -> None:
    toml, (ckpt, _vae) = make_workflow(tmp_path / "wf", hub)
    hub.cut_after, hub.cuts = 2500, 1  # the first GET ends after 2500 body bytes

    assert await run("install", str(toml), "--comfyui-dir", str(comfyui), "--quiet") == 0

    assert placed(comfyui, "checkpoints", ckpt).read_bytes() == ckpt.data
    # The 500 bytes of a chunk cut short are fetched again; the first 2000 are not.
    assert hub.sent[ckpt.sha256] == ckpt.size + 500
    ranges = [r.range for r in hub.requests
              if r.path == f"/cdn/{ckpt.sha256}" and r.method == "GET"]
    assert ranges == [None, "bytes=2000-"]


async def test_an_interrupted_run_is_resumed_by_the_next_run(
    hub: FakeHub, comfyui: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml, (ckpt, _vae) = make_workflow(tmp_path / "wf", hub)
    hub.cut_after, hub.cuts, hub.down_after_cut = 4000, 1, True  # then the hub is down

    assert await run("install", str(toml), "--comfyui-dir", str(comfyui), "--quiet") == 1
    err = capsys.readouterr().err
    assert "503" in err and "4.0 kB are kept and the next run resumes" in err
    assert not placed(comfyui, "checkpoints", ckpt).exists()
    assert await run("check", str(toml), "--comfyui-dir", str(comfyui)) == 1
    assert "(4.0 kB downloaded; install resumes)" in capsys.readouterr().out

    hub.down = False
    assert await run("install", str(toml), "--comfyui-dir", str(comfyui), "--quiet") == 0

    assert placed(comfyui, "checkpoints", ckpt).read_bytes() == ckpt.data
    assert hub.sent[ckpt.sha256] == ckpt.size  # the first 4000 bytes were not sent again
    assert [r.range for r in hub.requests if r.path == f"/cdn/{ckpt.sha256}"][-1] == (
        "bytes=4000-"
    )
    assert leftovers(comfyui) == []


async def test_a_wrong_byte_is_refused_and_nothing_is_placed(
    hub: FakeHub, comfyui: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml, (ckpt, _vae) = make_workflow(tmp_path / "wf", hub)
    hub.corrupt = 1234  # a mirror that changes one byte on the way

    assert await run("install", str(toml), "--comfyui-dir", str(comfyui), "--quiet") == 1

    err = capsys.readouterr().err
    bad = bytearray(ckpt.data)  # type: ignore[arg-type]
    bad[1234] ^= 0xFF
    received = hashlib.sha256(bad).hexdigest()
    assert "checkpoints/tiny_ckpt.safetensors" in err
    assert f"expected sha256 {ckpt.sha256}, received {received}" in err
    assert not placed(comfyui, "checkpoints", ckpt).exists()
    assert leftovers(comfyui) == []  # the bad download is deleted, not kept to resume


async def test_not_enough_disk_is_refused_before_any_byte(
    hub: FakeHub, comfyui: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    toml, _files = make_workflow(tmp_path / "wf", hub)
    real = shutil.disk_usage

    def small_disk(path: Any) -> Any:
        usage = real(path)
        return type(usage)(usage.total, usage.total - 5000, 5000)

    monkeypatch.setattr(local.shutil, "disk_usage", small_disk)

    assert await run("install", str(toml), "--comfyui-dir", str(comfyui)) == 1

    err = capsys.readouterr().err
    assert "not enough disk space: 2 files need 9.0 kB in" in err
    assert "which has 5.0 kB free; free 4.0 kB or more" in err
    assert hub.requests == []


async def test_a_gated_repository_says_how_to_get_access_and_never_shows_the_token(
    hub: FakeHub, comfyui: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    toml, (ckpt, _vae) = make_workflow(tmp_path / "wf", hub)
    hub.gate(REPO, TOKEN)
    redaction.install()
    caplog.set_level(logging.DEBUG)

    assert await run("install", str(toml), "--comfyui-dir", str(comfyui), "--quiet") == 1
    err = capsys.readouterr().err
    assert f"{REPO} is gated: sign in at {hub.url}/{REPO} and accept its conditions" in err
    assert f"HF_TOKEN or in {tmp_path / 'hf' / 'token'} (readable by you alone" in err

    monkeypatch.setenv("HF_TOKEN", "hf_" + "x" * 34)  # a token without access: 403
    assert await run("install", str(toml), "--comfyui-dir", str(comfyui), "--quiet") == 1
    assert f"{REPO} is gated" in capsys.readouterr().err

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub.cut_after, hub.cuts = 100, 1  # a retry logs the address it resumes
    assert await run("install", str(toml), "--comfyui-dir", str(comfyui)) == 0
    assert placed(comfyui, "checkpoints", ckpt).read_bytes() == ckpt.data
    assert any(r.authorized for r in hub.requests if "/resolve/" in r.path)
    out, err = capsys.readouterr()
    assert TOKEN not in out + err + caplog.text


async def test_a_token_file_others_can_read_is_refused(
    hub: FakeHub, comfyui: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml, (ckpt, _vae) = make_workflow(tmp_path / "wf", hub)
    hub.gate(REPO, TOKEN)
    token_file = tmp_path / "hf" / "token"
    token_file.parent.mkdir()
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o644)

    assert await run("install", str(toml), "--comfyui-dir", str(comfyui), "--quiet") == 1
    assert f"chmod 600 {token_file}" in capsys.readouterr().err
    assert hub.requests == []  # the token was not sent

    token_file.chmod(0o600)
    assert await run("install", str(toml), "--comfyui-dir", str(comfyui), "--quiet") == 0
    assert placed(comfyui, "checkpoints", ckpt).is_file()


async def test_via_anon_goes_through_the_socks_port_with_the_name_unresolved(
    hub: FakeHub, comfyui: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[anyone] socks is the operator's anon; a relay stands in for it and records
    what it is asked. hub.test resolves nowhere: only the proxy can reach it."""
    # huggingface_hub asks its Hub once per process for a registry of AI agents, unless
    # telemetry is off: as if this were the first download in the process.
    monkeypatch.setattr(hf_detect_agent, "_registry", None)
    monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(tmp_path / "no-cache.json"))
    relay = await SocksRelay().start()
    try:
        endpoint = f"http://hub.test:{hub.port}"
        hub.public_cdn_url = f"http://cdn.test:{hub.cdn_port}"
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        settings = tmp_path / "comfyveil.toml"
        settings.write_text(f'[anyone]\nsocks = "{relay.address}"\n')
        toml, (_ckpt, vae) = make_workflow(tmp_path / "wf", hub)

        assert await run("install", str(toml), "--comfyui-dir", str(comfyui), "--quiet",
                         "--via-anon", "--config", str(settings)) == 0

        assert placed(comfyui, "vae", vae).read_bytes() == vae.data
        assert set(relay.targets) == {("hub.test", hub.port), ("cdn.test", hub.cdn_port)}
        assert {r.host for r in hub.requests} == {f"hub.test:{hub.port}",
                                                  f"cdn.test:{hub.cdn_port}"}
        assert set(relay.users) == {"comfyveil-models"}  # circuits of its own
    finally:
        await relay.close()


async def test_a_file_of_another_size_in_the_way_is_not_overwritten(
    hub: FakeHub, comfyui: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml, (ckpt, _vae) = make_workflow(tmp_path / "wf", hub)
    mine = placed(comfyui, "checkpoints", ckpt)
    mine.write_bytes(b"an operator's own file")

    assert await run("install", str(toml), "--comfyui-dir", str(comfyui)) == 2
    assert "is there but is 22 bytes" in capsys.readouterr().err
    assert mine.read_bytes() == b"an operator's own file"
    assert hub.requests == []
    assert await run("check", str(toml), "--comfyui-dir", str(comfyui)) == 1
    assert f"wrong size {mine}: 22 bytes, expected {ckpt.size}" in capsys.readouterr().out


async def test_unpinned_file_is_checked_by_sha256_against_the_hub_before_downloading(
    hub: FakeHub, comfyui: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml, (ckpt, _vae) = make_workflow(tmp_path / "wf", hub, pinned=False)
    ckpt.sha256 = "0" * 64  # the hub's main branch now has another file than pinned
    # (the fake serves it under its old sha256 address; the manifest keeps the real one)
    hub.files[(REPO, ckpt.path)].sha256 = "0" * 64

    assert await run("install", str(toml), "--comfyui-dir", str(comfyui), "--quiet") == 1

    err = capsys.readouterr().err
    assert f"has sha256 {'0' * 64} on the hub, but the manifest pins" in err
    assert not any(r.path.startswith("/cdn/") for r in hub.requests)
    assert all("/resolve/main/" in r.path for r in hub.requests)



async def test_hf_hub_download_itself_accepts_the_fake_hub(hub: FakeHub, tmp_path: Path) -> None:
    """The fake is faithful enough for huggingface_hub's own entry point (the benchmark's
    baseline): X-Repo-Commit, X-Linked-Etag/Size on the redirect, the CDN elsewhere."""
    import asyncio

    import huggingface_hub

    item = hub.add(REPO, "split_files/one.safetensors", secrets.token_bytes(5000))
    path = await asyncio.to_thread(  # blocking; the fake runs on this loop
        huggingface_hub.hf_hub_download, REPO, item.path, revision=item.commit,
        local_dir=tmp_path / "plain", endpoint=hub.url, token=False,
    )
    assert Path(path).read_bytes() == item.data


async def test_check_against_a_running_comfyui_names_what_it_lacks(
    fake_comfy_factory: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = await fake_comfy_factory(models={
        "checkpoints": ["sd3.5_large_fp8_scaled.safetensors"],
        "diffusion_models": ["flux1-schnell.safetensors"],
        "text_encoders": ["clip_l.safetensors"],
    })

    assert await run("check", "sd3", "f", "--server", fake.url) == 1

    out = capsys.readouterr().out
    assert "present    checkpoints/sd3.5_large_fp8_scaled.safetensors" in out
    assert "present    diffusion_models/flux1-schnell.safetensors" in out
    assert "missing    vae/ae.safetensors" in out
    assert "2 missing; on the GPU host: comfyveil models install f --comfyui-dir DIR" in out
    assert await run("check", "sd3", "--server", fake.url) == 0


async def test_no_download_address_nor_header_is_logged_at_any_verbosity(
    hub: FakeHub, comfyui: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """-vv (DEBUG) with a cut, so huggingface_hub's own retry warning is made too: the
    signed CDN address (a working download link) never reaches a line, nor a header."""
    toml, (ckpt, _vae) = make_workflow(tmp_path / "wf", hub)
    hub.cut_after, hub.cuts = 2500, 1
    names = ("", *logs.QUIET_LIBRARIES, *logs.SILENT_LIBRARIES, "huggingface_hub")
    before = {name: logging.getLogger(name).level for name in names}
    try:
        logs.configure(logging.DEBUG, None)  # what -vv sets up
        caplog.set_level(logging.DEBUG)
        assert await run("install", str(toml), "--comfyui-dir", str(comfyui), "--quiet") == 0
    finally:
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)
    assert placed(comfyui, "checkpoints", ckpt).read_bytes() == ckpt.data
    text = caplog.text.lower()
    assert "/cdn/" in text  # the retry was logged, by path
    assert "sig=" not in text and "expires=" not in text
    assert "x-repo-commit" not in text and "x-linked" not in text and "location" not in text


async def test_a_server_sending_more_than_the_pinned_size_is_stopped_there(
    hub: FakeHub, comfyui: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml, (ckpt, _vae) = make_workflow(tmp_path / "wf", hub)
    hub.oversize = 64 * 1024 * 1024  # a tampering CDN that would fill the disk

    assert await run("install", str(toml), "--comfyui-dir", str(comfyui), "--quiet") == 1

    err = capsys.readouterr().err
    assert "checkpoints/tiny_ckpt.safetensors" in err and "longer than the 6000 bytes" in err
    assert not placed(comfyui, "checkpoints", ckpt).exists()
    assert leftovers(comfyui) == []  # no partial file of a lying server is kept
    # stopped while it came: far less than the 64 MiB offered was taken
    assert hub.sent[ckpt.sha256] < 16 * 1024 * 1024
