"""Worker heartbeats in PostgreSQL, and `comfyveil status` reading them with the backends."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from comfyveil import config_load
from comfyveil.cli import status
from comfyveil.store import database
from comfyveil.worker import heartbeat
from tests import zygote

pytestmark = [pytest.mark.timeout(120)]


def fake_worker(name: str, running: int = 0) -> SimpleNamespace:
    return SimpleNamespace(worker_id=name, running_jobs=[object()] * running)


async def test_a_worker_gone_quiet_for_its_lease_is_shown_as_gone_and_a_clean_stop_leaves(
    db: database.Database,
) -> None:
    lease = 0.6
    live = heartbeat.Heartbeat(db, fake_worker("live", running=2), lease_seconds=lease)
    quiet = heartbeat.Heartbeat(db, fake_worker("quiet"), lease_seconds=lease)
    assert await quiet.beat()  # written once, then never again: it died
    task = live.start()
    try:
        await asyncio.sleep(lease * 1.5)
        beats = {b.worker_id: b for b in await db.heartbeats.all(lease)}
        assert beats["live"].alive and beats["live"].jobs_running == 2
        assert beats["live"].version == "0.1.0" and beats["live"].host
        assert not beats["quiet"].alive  # still listed, as gone
        assert await db.heartbeats.alive(lease) == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert [b.worker_id for b in await db.heartbeats.all(lease)] == ["quiet"]


async def test_status_shows_the_database_each_backend_and_each_worker(
    db: database.Database, database_url: str, fake_comfy_factory, tmp_path: Path
) -> None:
    full = await fake_comfy_factory()
    bare = await fake_comfy_factory(models={"checkpoints": [], "unet": [], "vae": [], "clip": []})
    settings = config_load.from_mapping(
        {
            "database": {"url": database_url},
            "backends": [
                {"name": "full", "url": full.url, "via": "direct"},
                {"name": "bare", "url": bare.url, "via": "direct"},
                {"name": "dead", "url": "http://127.0.0.1:9", "via": "direct"},
            ],
            "worker": {"lease_seconds": 5.0},
        },
        base=tmp_path,
        environ={},
    )
    await db.commands.seed()
    await heartbeat.Heartbeat(db, fake_worker("w1", 1), lease_seconds=5.0).beat()
    rows = await status.gather(settings)
    by_name = {(part, name): (state, detail) for part, name, state, detail in rows}
    assert by_name[("database", "external")][0] == "ok"
    assert "0 queued, 0 running" in by_name[("database", "external")][1]
    assert by_name[("backend", "full")] == ("up", "0 in its queue; every command can run")
    state, detail = by_name[("backend", "bare")]
    # One short line naming the commands, not every file (~40 wrapped lines before).
    assert state == "up" and "cannot run /f " in detail and "(models missing)" in detail
    assert "model file(s) missing: see /backends or `comfyveil models check`" in detail
    assert "safetensors" not in detail and len(detail) < 200, detail
    assert by_name[("backend", "dead")][0] == "down"
    state, detail = by_name[("worker", "w1")]
    assert state == "alive" and "1 job(s) running" in detail

    cfg = tmp_path / "comfyveil.toml"
    cfg.write_text(
        f'[database]\nurl = "{database_url}"\n\n'
        f'[[backends]]\nname = "dead"\nurl = "http://127.0.0.1:9"\nvia = "direct"\n'
    )
    proc = await zygote.comfyveil(
        "status",
        "--config",
        str(cfg),
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1, err  # no backend up: a check can tell
    text = out.decode()
    assert "database" in text and "dead" in text and "down" in text and "w1" in text
    assert "Traceback" not in err.decode()
