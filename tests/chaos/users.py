"""Simulated users on every front end, and the history of what each was told.

Every request carries a token of its own in its prompt (``chaos-<n>``), so what it
became in the database can be found without trusting the product's own bookkeeping.
A user is told a request was accepted when the front end said so: the chat's reply, the
web's redirect to a job page, the API's answer, the CLI's job id.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import random
import re
import time
from typing import Any

import aiohttp

from tests.chaos.system import System

SIZE = {"width": 256, "height": 256}
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
JOB_PATH = re.compile(r"/jobs/([0-9a-f-]{36})")
KEY = re.compile(r"(cv-[A-Za-z0-9_-]+)")
PASSPHRASE = "correct horse battery staple chaos"


@dataclasses.dataclass
class Request:
    """One thing a user asked for, and what the front end told them."""

    rid: int
    front: str  # chat, web, api, cli
    token: str
    sent_at: float
    user: str
    told: str = "nothing"  # accepted, refused, result, failure, error, nothing
    detail: str = ""
    job_ids: list[str] = dataclasses.field(default_factory=list)
    cancelled: bool = False
    rerolls: int = 0
    forgotten: bool = False
    message_id: int | None = None


class History:
    def __init__(self) -> None:
        self.requests: list[Request] = []
        # (sent at, chat, "cancel" or "forget") of each /cancel and /forget
        self.commands: list[tuple[float, str, str]] = []
        self._next = 0

    def new(self, front: str, user: str) -> Request:
        self._next += 1
        request = Request(self._next, front, f"chaos-{self._next:06d}", time.monotonic(), user)
        self.requests.append(request)
        return request


class Users:
    """Users of the chat, the web form, the images API and `comfyveil submit`."""

    def __init__(self, system: System, history: History, rng: random.Random) -> None:
        self.system = system
        self.history = history
        self.rng = rng
        self.sessions: list[aiohttp.ClientSession] = []
        self.api_keys: list[str] = []
        self.tasks: set[asyncio.Task[None]] = set()

    async def prepare(self, web_users: int = 3) -> None:
        """Web accounts by invitation, and an API key each."""
        for index in range(web_users):
            code, out, err = await self.system.cli("web", "invite")
            link = next((w for w in out.split() if "/invite/" in w), None)
            assert code == 0 and link, f"no invitation: {out} {err}"
            session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
            async with session.get(link) as response:
                page = await response.text()
            form = {
                "csrf": _csrf(page),
                "name": f"chaos{index}",
                "passphrase": PASSPHRASE,
                "again": PASSPHRASE,
            }
            async with session.post(link, data=form) as response:
                assert response.status == 200, await response.text()
            self.sessions.append(session)
            code, out, err = await self.system.cli("web", "apikey", f"chaos{index}")
            found = KEY.search(out)
            assert code == 0 and found, f"no API key: {out} {err}"
            self.api_keys.append(found.group(1))

    def spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def one(self) -> None:
        """Start one request on a front end drawn at random."""
        front = self.rng.choices(["chat", "web", "api", "cli"], weights=[50, 25, 20, 5])[0]
        self.spawn(getattr(self, front)())

    # -- the chat -------------------------------------------------------------------

    async def chat(self) -> None:
        user_id = 1000 + self.rng.randrange(40)
        request = self.history.new("chat", str(user_id))
        text = f"/f {request.token} a fox in snow --width 256 --height 256"
        message = self.system.telegram.user_sends(user_id, text)
        request.message_id = message["message_id"]
        roll = self.rng.random()
        if roll < 0.08:
            await asyncio.sleep(self.rng.uniform(0.2, 3))
            self.history.commands.append((time.monotonic(), str(user_id), "cancel"))
            self.system.telegram.user_sends(user_id, "/cancel")
            request.cancelled = True
        elif roll < 0.16:
            await self._reroll_later(request, user_id)
        elif roll < 0.18:
            await asyncio.sleep(self.rng.uniform(1, 5))
            await self._forget(user_id)

    async def _reroll_later(self, request: Request, user_id: int) -> None:
        """Press Re-roll under the result once it is there."""
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            await asyncio.sleep(2)
            with contextlib.suppress(Exception):  # the database may be down: try again
                ids = {row["id"].hex for row in await self.system.jobs_for(request.token)}
                for call in self.system.telegram.calls("sendPhoto"):
                    again = next((d for d in _buttons(call.result) if d.startswith("again:")), None)
                    if again and again.split(":", 1)[1] in ids:
                        self.system.telegram.user_presses(user_id, call.result["message_id"], again)
                        request.rerolls += 1
                        return

    async def _forget(self, user_id: int) -> None:
        """/forget, then Yes on the question it asked (not an older one); every request
        of this user sent before the bot has acted on the Yes may be gone with it."""
        sent_at = time.monotonic()
        self.history.commands.append((sent_at, str(user_id), "forget"))
        self.system.telegram.user_sends(user_id, "/forget")
        deadline = sent_at + 90
        while time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            for call in self.system.telegram.calls("sendMessage"):
                if call.at < sent_at or str(call.params.get("chat_id")) != str(user_id):
                    continue
                data = _buttons(call.result)
                yes = next((d for d in data if d.startswith("forget") and d.endswith("yes")), None)
                if yes:
                    await self._confirm_forget(user_id, call.result["message_id"], yes)
                    return

    async def _confirm_forget(self, user_id: int, message_id: int, yes: str) -> None:
        self.system.telegram.user_presses(user_id, message_id, yes)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until the question says it is done
            shown = [
                m for m in self.system.telegram.messages(user_id) if m["message_id"] == message_id
            ]
            if shown and not _buttons(shown[0]):
                break
            await asyncio.sleep(1.0)
        for request in self.history.requests:
            if request.front == "chat" and request.user == str(user_id):
                request.forgotten = True

    # -- the web form -----------------------------------------------------------------

    async def web_form(self, session: aiohttp.ClientSession, request: Request) -> None:
        url = self.system.web_url
        async with session.get(url + "/c/f") as response:
            page = await response.text()
            if not CSRF.search(page):
                # the form page itself failed: a sentence in the page is an answer, a
                # page with none (or a stack trace) is not
                said = _first_error(page)
                told_why = response.status != 500 and said != "refused" and "Traceback" not in page
                request.told = "refused" if told_why else "error"
                request.detail = f"form page {response.status}: {said}"
                return
        form = {
            "csrf": _csrf(page),
            "prompt": f"{request.token} a fox",
            **{k: str(v) for k, v in SIZE.items()},
        }
        async with session.post(url + "/c/f", data=form, allow_redirects=False) as response:
            location = response.headers.get("Location", "")
            body = await response.text()
            found = JOB_PATH.search(location)
            if response.status in (302, 303) and found:
                request.told, request.job_ids = "accepted", [found.group(1)]
            else:
                said = _first_error(body)
                told_why = response.status != 500 and said != "refused"
                request.told = "refused" if told_why else "error"
                request.detail = f"{response.status}: {said}"
        if request.told == "accepted" and self.rng.random() < 0.1:
            async with session.get(url + location) as response:
                page = await response.text()
            with contextlib.suppress(AssertionError):
                async with session.post(
                    url + location + "/cancel", data={"csrf": _csrf(page)}
                ) as response:
                    await response.read()
                    request.cancelled = True

    async def web(self) -> None:
        index = self.rng.randrange(len(self.sessions))
        request = self.history.new("web", f"web{index}")
        try:
            await self.web_form(self.sessions[index], request)
        except (aiohttp.ClientConnectionError, OSError, TimeoutError) as exc:
            # the server was down (a restart): the user was told nothing, and tries later
            request.told, request.detail = "nothing", type(exc).__name__
        except (aiohttp.ClientError, AssertionError) as exc:
            request.told, request.detail = "error", type(exc).__name__

    # -- the images API, through OpenAI's SDK with its own retries -------------------

    async def api(self) -> None:
        import openai

        index = self.rng.randrange(len(self.api_keys))
        request = self.history.new("api", f"web{index}")
        client = openai.AsyncOpenAI(
            base_url=self.system.web_url + "/v1", api_key=self.api_keys[index], timeout=20
        )  # SDK retries on
        try:
            result = await client.images.generate(
                model="f",
                prompt=f"{request.token} a fox",
                size="256x256",
                response_format="b64_json",
            )
            data = base64.b64decode(result.data[0].b64_json or "")
            request.told = "result" if data else "error"
        except openai.APIStatusError as exc:
            request.told = "failure" if exc.status_code < 500 else "error"
            request.detail = f"{exc.status_code} {str(exc.message)[:120]}"
        except (openai.APIConnectionError, openai.APITimeoutError) as exc:
            request.told, request.detail = "nothing", type(exc).__name__
        finally:
            await client.close()

    # -- comfyveil submit --wait -----------------------------------------------------------

    async def cli(self) -> None:
        request = self.history.new("cli", "cli")
        out_dir = self.system.tmp / "cli-out" / request.token
        code, _out, err = await self.system.cli(
            "submit",
            "f",
            f"{request.token} a fox",
            "--set",
            "width=256",
            "--set",
            "height=256",
            "--wait",
            "--out",
            str(out_dir),
            timeout=300,
        )
        request.detail = (err.strip().splitlines() or [""])[-1][:200]
        if code == 0:
            request.told = "result"
        elif "Traceback" in err:
            request.told = "error"
        else:
            request.told = "failure"

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        for session in self.sessions:
            await session.close()


def _csrf(page: str) -> str:
    found = CSRF.search(page)
    if not found:
        raise AssertionError("no form on the page")
    return found.group(1)


def _first_error(body: str) -> str:
    found = re.search(r'class="(?:error|problem)"[^>]*>([^<]{1,160})', body)
    return found.group(1).strip() if found else "refused"


def _buttons(message: dict[str, Any]) -> list[str]:
    markup = message.get("reply_markup") or {}
    return [b.get("callback_data", "") for row in markup.get("inline_keyboard", []) for b in row]
