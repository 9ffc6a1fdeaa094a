"""The images API's bodies and a command's web form, fuzzed against the real server: no
input gets a 5xx or an ERROR in the log, and every refusal has the front end's shape."""

from __future__ import annotations

import asyncio
import logging
import os

import aiohttp

from tests.api.test_api_openai import make_key
from tests.fuzz import http
from tests.web.support import client, csrf_of, get_text, sign_up, web_stack

# A short run in the suite; scripts/fuzz.py (make fuzz) sends many more.
COUNT = int(os.environ.get("FUZZ_HTTP_COUNT", "60"))
# The campaign draws new inputs each run; the suite the same ones every time.
SEED = None if "FUZZ_HTTP_COUNT" in os.environ else 0


def _is_openai_error(payload: object) -> bool:
    return (
        isinstance(payload, dict)
        and isinstance(payload.get("error"), dict)
        and isinstance(payload["error"].get("message"), str)
        and bool(payload["error"]["message"].strip())
    )


async def send_api_bodies(
    session: aiohttp.ClientSession,
    url: str,
    key: str,
    bodies: list[bytes],
    edits: list[list[tuple[str, bytes, str | None]]],
) -> list[str]:
    """Each body to its route; what went wrong, one line per input."""
    problems: list[str] = []
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    for body in bodies:
        try:
            async with session.post(
                url + "/v1/images/generations", data=body, headers=headers
            ) as response:
                problems += await _judge(response, body)
        except aiohttp.ClientError as exc:  # the answer never reached the client
            problems.append(f"{type(exc).__name__} for {body!r:.300}")
    for parts in edits:
        form = aiohttp.FormData()
        for name, data, filename in parts:
            if filename is None:  # a plain field, as clients send the prompt and model
                if not name.isascii():  # aiohttp's client aborts sending such a part
                    name = name.encode("unicode_escape").decode()
                form.add_field(name, data.decode("utf-8", "replace"))
            else:
                form.add_field(name, data, filename=filename)
        try:
            async with session.post(
                url + "/v1/images/edits", data=form, headers={"Authorization": f"Bearer {key}"}
            ) as response:
                problems += await _judge(response, parts)
        except aiohttp.ClientError as exc:  # the answer never reached the client
            problems.append(f"{type(exc).__name__} for {parts!r:.300}")
    return problems


async def _judge(response: aiohttp.ClientResponse, sent: object) -> list[str]:
    if response.status >= 500:
        return [f"{response.status} for {sent!r:.300}"]
    if response.status >= 400:
        try:
            payload = await response.json(content_type=None)
        except ValueError:
            payload = None
        if not _is_openai_error(payload):
            return [f"{response.status} without an error object for {sent!r:.300}"]
    else:
        await response.read()
    return []


async def test_the_images_api_answers_every_body_without_a_server_error(
    db, fake_comfy, caplog
) -> None:
    # JSON nested past Python's stack: json raised RecursionError, a 500.
    bodies = [b"[" * 100_000, b'{"model": "f", "prompt": "x", "n": 1e400}']
    bodies += await asyncio.to_thread(http.draw, http.RAW_BODIES, COUNT, seed=SEED)
    edits = await asyncio.to_thread(http.draw, http.EDIT_PARTS, COUNT // 3, seed=SEED)
    caplog.set_level(logging.WARNING)
    async with web_stack(db, [fake_comfy], api=True) as stack, client() as session:
        await sign_up(session, await stack.invite(), "fuzz")
        key = await make_key(session, stack.url)
        problems = await send_api_bodies(session, stack.url, key, bodies, edits)
    assert problems == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_commands_web_form_answers_every_submission_without_a_server_error(
    db, fake_comfy, caplog
) -> None:
    # A non-ASCII CSRF token made hmac.compare_digest raise: a 500 and an ERROR line.
    forms = [{"csrf": "é", "prompt": "a fox"}]
    forms += await asyncio.to_thread(http.draw, http.FORM_FIELDS, COUNT, seed=SEED)
    caplog.set_level(logging.WARNING)
    async with web_stack(db, [fake_comfy]) as stack, client() as session:
        await sign_up(session, await stack.invite(), "fuzz")
        problems = await send_forms(session, stack.url, forms)
    assert problems == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def send_forms(
    session: aiohttp.ClientSession, url: str, forms: list[dict[str, str]]
) -> list[str]:
    problems: list[str] = []
    for fields in forms:
        _, page = await get_text(session, url + "/c/f")
        form = {**fields, "csrf": csrf_of(page)} if "csrf" not in fields else fields
        async with session.post(url + "/c/f", data=form) as response:
            await response.read()
            if response.status >= 500:
                problems.append(f"{response.status} for {fields!r:.300}")
    return problems
