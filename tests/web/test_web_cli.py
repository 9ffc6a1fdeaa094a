"""`comfyveil run` without a Telegram token serves the web front end alone;
`comfyveil web invite` prints a one-time sign-up link."""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path

from tests.fakes.comfyui import FakeComfyUI
from tests.web.support import cli, cli_config, cli_invite, client, sign_up, spawn


async def test_run_without_a_token_serves_the_web_alone_with_a_first_invite(
    fake_comfy: FakeComfyUI, database_url: str, tmp_path: Path
) -> None:
    conf = cli_config(tmp_path, database_url, fake_comfy)
    proc = await spawn(conf, "run")
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
        invite = await cli_invite(conf)
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


async def test_web_invite_prints_a_one_time_link(
    fake_comfy: FakeComfyUI, database_url: str, tmp_path: Path
) -> None:
    conf = cli_config(tmp_path, database_url, fake_comfy)
    code, out, err = await cli(conf, "web", "invite", "--admin")
    assert code == 0, err
    first, second = out.splitlines()
    assert re.fullmatch(r"http://127\.0\.0\.1:0/invite/[A-Za-z0-9_-]{43}", first)
    assert "works once" in second and "admin" in second
