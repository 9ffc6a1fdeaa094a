"""`comfyveil run` without a Telegram token serves the web front end alone;
`comfyveil web invite` prints a one-time sign-up link."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

from tests.fakes.comfyui import FakeComfyUI
from tests.web.support import client, sign_up


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYVEIL_")}
    env.pop("DATABASE_URL", None)
    return env


def _config(tmp_path: Path, database_url: str, comfy: FakeComfyUI) -> Path:
    conf = tmp_path / "comfyveil.toml"
    conf.write_text(
        f'data_dir = "{tmp_path}"\n'
        f'[database]\nurl = "{database_url}"\n'
        f'[[backends]]\nname = "gpu0"\nurl = "{comfy.url}"\nvia = "direct"\n'
        "[web]\nport = 0\n"
    )
    return conf


async def test_run_without_a_token_serves_the_web_alone_with_a_first_invite(
    fake_comfy: FakeComfyUI, database_url: str, tmp_path: Path
) -> None:
    conf = _config(tmp_path, database_url, fake_comfy)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "comfyveil",
        "run",
        "--config",
        str(conf),
        env=_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        lines = []
        while not any("runs alone" in line for line in lines):
            raw = await asyncio.wait_for(proc.stdout.readline(), 60)  # type: ignore[union-attr]
            assert raw, "stdout closed: " + "".join(lines)
            lines.append(raw.decode())
        text = "".join(lines)
        url = re.search(r"web front end at (http://127\.0\.0\.1:\d+)", text)
        assert url, text
        # stdout is no terminal here (a journal, a log file): no link, but its command
        assert "/invite/" not in text, text
        assert "`comfyveil web invite --admin` prints the first admin's invitation" in text
        invite = await _invite(conf)
        async with client() as session:
            home = await sign_up(
                session, invite.replace("http://127.0.0.1:0", url.group(1)), "root"
            )
            assert 'href="/admin"' in home
        proc.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()[-2000:]
        assert b"stopped" in out
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _invite(conf: Path) -> str:
    """What `comfyveil web invite --admin` prints: the link."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "comfyveil",
        "web",
        "invite",
        "--admin",
        "--config",
        str(conf),
        env=_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode().splitlines()[0]


async def test_web_invite_prints_a_one_time_link(
    fake_comfy: FakeComfyUI, database_url: str, tmp_path: Path
) -> None:
    conf = _config(tmp_path, database_url, fake_comfy)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "comfyveil",
        "web",
        "invite",
        "--admin",
        "--config",
        str(conf),
        env=_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    first, second = out.decode().splitlines()
    assert re.fullmatch(r"http://127\.0\.0\.1:0/invite/[A-Za-z0-9_-]{43}", first)
    assert "works once" in second and "admin" in second
