"""The web front end as a hidden service on the session's private Anyone network:
`comfyveil web` with `[web] hidden_service = true` and a client, opened in Chromium
(JavaScript off) through the bot-side anon's SOCKS socket. Chromium may not resolve any
name itself (every name maps to "not found"), and a relay in front of the SOCKS socket
records that every connection asked for the .anon name, as a name."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
from pathlib import Path

import pytest

from tests import zygote
from tests.anyone.test_anyone_product import RecordingRelay
from tests.fakes.comfyui import FakeComfyUI
from tests.fixtures.anyone import AnonPair, PrivateAnyoneNetwork
from tests.web.browser import launch, needs_chromium
from tests.web.support import PASSPHRASE, cli_env, cli_invite

pytestmark = [pytest.mark.anyone, pytest.mark.slow, needs_chromium]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    return cli_env(COMFYVEIL_ANYONE_FORBID_PUBLIC="1")


async def _line(proc: zygote.Process, pattern: str, seen: list[str]) -> re.Match[str]:
    while True:
        for line in seen:
            found = re.search(pattern, line)
            if found:
                return found
        raw = await asyncio.wait_for(proc.stdout.readline(), 180)  # type: ignore[union-attr]
        assert raw, "comfyveil stopped: " + "".join(seen)
        seen.append(raw.decode())


async def test_the_web_front_end_opens_through_its_anon_address(
    anon_pair: AnonPair,
    anyone_network: PrivateAnyoneNetwork,
    fake_comfy: FakeComfyUI,
    database_url: str,
    tmp_path: Path,
) -> None:
    assert anyone_network.network is not None
    net_file = tmp_path / "private-network.txt"
    net_file.write_text(anyone_network.network.to_file_text())
    port = _free_port()
    conf = tmp_path / "comfyveil.toml"
    conf.write_text(
        f'data_dir = "{tmp_path / "data"}"\n'
        f'[database]\nurl = "{database_url}"\n'
        f'[[backends]]\nname = "gpu0"\nurl = "{fake_comfy.url}"\nvia = "direct"\n'
        f'[anyone]\nbinary = "{anyone_network.binary}"\nprivate_network = "{net_file}"\n'
        f'[web]\nport = {port}\nhidden_service = true\nclient_auth = ["tester"]\n'
    )
    proc = await zygote.comfyveil(
        "web",
        "--config",
        str(conf),
        env=_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    seen: list[str] = []
    try:
        address = (await _line(proc, r"hidden service: http://([a-z2-7]{56}\.\w+)", seen))[1]
        key_file = Path((await _line(proc, r"web client tester: key file (\S+)", seen))[1])
        # stdout is a pipe, no terminal: the command that prints the link, not the link
        await _line(proc, r"`comfyveil web invite --admin` prints", seen)
        invite = await cli_invite(conf, env=_env())  # at the .anon address
        assert invite.startswith(f"http://{address}/invite/")
        assert oct(key_file.stat().st_mode & 0o777) == "0o600"
        await _line(proc, r"web hidden service is published", seen)
        await anon_pair.client.add_client_key(key_file)
        # Chromium speaks SOCKS over TCP; our anon listens on a Unix socket. The relay
        # between them records what each CONNECT asked for.
        assert anon_pair.client.socks_path is not None
        relay = RecordingRelay(anon_pair.client.socks_path)
        relay_port = await relay.start()
        proxy = [
            f"--proxy-server=socks5://127.0.0.1:{relay_port}",
            # Chromium resolves no name itself (the proxy's own address is a literal).
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        ]
        async with launch(proxy) as browser:
            context = await browser.new_context(java_script_enabled=False)
            context.set_default_timeout(120_000)
            page = await context.new_page()
            response = None
            failures: list[str] = []
            for _ in range(5):  # the first descriptor fetch on a fresh network may fail
                try:
                    response = await page.goto(invite)
                    if response is not None:
                        break
                except Exception as exc:  # Playwright's net::ERR_* errors
                    failures.append(str(exc).splitlines()[0])
                    await asyncio.sleep(3)
            assert response is not None and response.status == 200, failures
            assert response.headers.get("x-frame-options") == "DENY"
            await page.get_by_label("Name").fill("tester")
            await page.get_by_label("Passphrase", exact=True).fill(PASSPHRASE)
            await page.get_by_label("Passphrase again").fill(PASSPHRASE)
            await page.get_by_role("button", name="Create account").click()
            await page.wait_for_selector("text=Log out (tester)")
            assert page.url.startswith(f"http://{address}/")
        await relay.stop()
        assert relay.requests, "Chromium went through the SOCKS proxy"
        # Every connection named its host (none was resolved here); ours named the .anon
        # one. (Chromium's own background requests, to Google hosts, also go to the proxy,
        # by name, and fail there: the private network reaches nothing else.)
        assert {kind for kind, _, _, _ in relay.requests} == {"domain"}
        assert address in {host for _, host, _, _ in relay.requests}
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()[-2000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
