"""How ManagedAnon follows its hidden services' descriptor uploads (HS_DESC events, as
anon sends them on the control port: one UPLOAD per directory when a publication starts,
then UPLOADED or FAILED for each; a publication again first closes the uploads of that
descriptor still on their way, with no event)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from comfyveil.anyone import control, process, uploads
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


def _event(action: str, directory: int, descriptor: str = "DESCID") -> control.Event:
    """As anon words them: only an UPLOAD names the descriptor (its blinded key)."""
    hsdir = f"${'C' * 39}{directory}~relay{directory}"
    text = f"HS_DESC {action} {SERVICE} UNKNOWN {hsdir}"
    if action == "UPLOAD":
        text += f" {descriptor} HSDIR_INDEX={'D' * 64}"
    elif action == "FAILED":
        text += " REASON=UPLOAD_REJECTED"
    return control.Event("HS_DESC", text)


@contextlib.asynccontextmanager
async def _watched(
    tmp_path: Path,
) -> AsyncIterator[tuple[process.ManagedAnon, asyncio.Queue[control.Event]]]:
    """A ManagedAnon following the events put on the queue, as from its control port."""
    anon = _anon(tmp_path)
    events: asyncio.Queue[control.Event] = asyncio.Queue()
    watching = asyncio.create_task(anon._watch_events(events))
    try:
        yield anon, events
    finally:
        watching.cancel()


async def _drained(events: asyncio.Queue[control.Event]) -> None:
    """Until the watcher has taken every event, and any waiter it woke has run."""
    while not events.empty():
        await asyncio.sleep(0)
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_publication_is_everywhere_only_when_every_directory_has_answered(
    tmp_path: Path,
) -> None:
    async with _watched(tmp_path) as (anon, events):
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


async def test_a_publication_again_replaces_the_uploads_anon_closed_unsaid(
    tmp_path: Path,
) -> None:
    """A client revoked while the last publication was still on its way: anon closes those
    uploads without an event and starts again. Counted one by one they stayed on their
    way for ever, and the wait for every directory ran out."""
    async with _watched(tmp_path) as (anon, events):
        for directory in range(3):
            events.put_nowait(_event("UPLOAD", directory))
        events.put_nowait(_event("UPLOADED", 0))
        for directory in range(3):  # closed: 1 and 2 never answer; all three again
            events.put_nowait(_event("UPLOAD", directory))
        await _drained(events)
        after = anon.upload_count(SERVICE)
        everywhere = asyncio.create_task(
            anon.wait_published(SERVICE, after=after, within=5, everywhere=True)
        )
        for directory in range(3):
            events.put_nowait(_event("UPLOADED", directory))
        await asyncio.wait_for(everywhere, 5)


def test_a_round_to_other_directories_forgets_the_last_rounds_unanswered_ones() -> None:
    """The directories of a descriptor change with the consensus: a round begun more than
    ROUND_GAP after the last one waits only for its own directories."""
    now = [0.0]
    seen = uploads.DescriptorUploads(clock=lambda: now[0])
    for directory in (1, 2):
        assert seen.feed(_event("UPLOAD", directory, "BLINDED1").text)
    assert seen.on_the_way(SERVICE) == 2
    now[0] += uploads.ROUND_GAP + 1
    for directory in (3, 4):
        seen.feed(_event("UPLOAD", directory, "BLINDED1").text)
    seen.feed(_event("UPLOAD", 1, "BLINDED2").text)  # the next period's descriptor: its own
    assert seen.on_the_way(SERVICE) == 3
    for directory in (3, 4):
        seen.feed(_event("UPLOADED", directory).text)
    assert seen.on_the_way(SERVICE) == 1
    seen.feed(_event("FAILED", 1).text)
    assert seen.on_the_way(SERVICE) == 0
    # A round no answer ended, of a descriptor never published again (its time period
    # gone), is not waited for past STALE_AFTER.
    seen.feed(_event("UPLOAD", 5, "BLINDED0").text)
    assert seen.on_the_way(SERVICE) == 1
    now[0] += uploads.STALE_AFTER + 1
    assert seen.on_the_way(SERVICE) == 0
    assert seen.uploaded(SERVICE) == 2
    assert not seen.feed("HS_DESC RECEIVED " + SERVICE + " NO_AUTH $" + "C" * 40 + " X")
