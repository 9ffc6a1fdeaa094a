"""How ManagedAnon follows its hidden services' descriptor uploads (HS_DESC events, as
anon sends them on the control port: one UPLOAD per directory when a publication starts,
then UPLOADED or FAILED for each)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from comfyveil.anyone import control, process
from comfyveil.anyone import network as network_mod

SERVICE = "a" * 56
AUTHORITY = "auth0 orport=5000 no-v2 v3ident=" + "A" * 40 + " 127.0.0.1:5001 " + "B" * 40


def _anon(tmp_path: Path) -> process.ManagedAnon:
    binary = tmp_path / "anon"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o700)
    return process.ManagedAnon(
        network=network_mod.PrivateNetwork((AUTHORITY,)),
        binary=binary,
        data_dir=tmp_path / "state",
    )


def _event(action: str, directory: int) -> control.Event:
    return control.Event(
        "HS_DESC", f"HS_DESC {action} {SERVICE} UNKNOWN ${'C' * 39}{directory} DESCID"
    )


async def _drained(events: asyncio.Queue[control.Event]) -> None:
    """Until the watcher has taken every event, and any waiter it woke has run."""
    while not events.empty():
        await asyncio.sleep(0)
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_publication_is_everywhere_only_when_every_directory_has_answered(
    tmp_path: Path,
) -> None:
    anon = _anon(tmp_path)
    events: asyncio.Queue[control.Event] = asyncio.Queue()
    watching = asyncio.create_task(anon._watch_events(events))
    try:
        for directory in range(3):
            events.put_nowait(_event("UPLOAD", directory))
        events.put_nowait(_event("UPLOADED", 0))
        found = asyncio.create_task(anon.wait_published(SERVICE, within=5))
        everywhere = asyncio.create_task(anon.wait_published(SERVICE, within=5, everywhere=True))
        await asyncio.wait_for(found, 5)  # one directory has it: the service can be found
        assert anon.upload_count(SERVICE) == 1
        await _drained(events)
        assert not everywhere.done()  # two directories still serve the one before

        events.put_nowait(_event("FAILED", 1))  # a directory that refused is done too
        await _drained(events)
        assert not everywhere.done()
        events.put_nowait(_event("UPLOADED", 2))
        await asyncio.wait_for(everywhere, 5)
        assert anon.upload_count(SERVICE) == 2
    finally:
        watching.cancel()
