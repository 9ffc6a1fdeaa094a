"""A fake Telegram Bot API server that python-telegram-bot can be pointed at.

It follows the real wire format (https://core.telegram.org/bots/api): every answer is
``{"ok": true, "result": ...}`` or ``{"ok": false, "error_code": N, "description": "..."}``,
parameters arrive as a query string, urlencoded or multipart form (values JSON-encoded
when they are not strings, as PTB sends them) or a JSON body, and errors use the real
descriptions ("Bad Request: message is not modified: ...", "Too Many Requests: retry
after N"). Point PTB at it with::

    Application.builder().token(fake.token)
        .base_url(fake.base_url).base_file_url(fake.base_file_url)

Tests drive it as users would: ``user_sends`` and ``user_presses`` queue updates that
``getUpdates`` long polling delivers; ``sent``, ``messages(chat_id)`` and ``wait_for``
show what the bot did; ``rate_limit_next`` and ``fail_next`` script failures;
``open_chat``, ``block_bot``, ``kick_bot`` and ``migrate_group`` change which chats the bot
can reach, answering as the real API does ("Forbidden: bot was blocked by the user",
"Forbidden: bot was kicked from the group chat", 400 "Bad Request: group chat was upgraded
to a supergroup chat" with ``parameters.migrate_to_chat_id``).

``enforce_limits()`` (opt-in) makes it answer like Telegram does to a bot that sends too
fast: more than 30 messages a second overall, more than one a second to one private
chat (after a short burst of 3, which Telegram tolerates), or more than 20 a minute to
one group gets ``429 Too Many Requests: retry after
N`` with ``parameters.retry_after`` N in whole seconds, as the real API sends it.
Every send* call (not sendChatAction) and edit* call counts toward the overall limit;
toward a chat's own limit only new messages (send*) do, as Telegram's per-chat limits are
on messages sent to that chat. Deleting, answering button presses, getFile and the like
are not counted. Telegram publishes none of this and changes it, so `Limits` also models
other rules: a lower overall rate, deletions counted toward it (``count_deletions``), a
slower private chat (``private=0.5``: one message every 2 s) or a smaller burst.
``delay_arrivals`` makes the path slow and uneven, as Telegram counts a message when it
arrives.

Deliberate simplifications: one bot per server; HTML parse mode is parsed into text and
entities like the real server (MarkdownV2 text is kept as sent); inline messages,
payments, stickers, polls and webhooks delivery are not implemented (``setWebhook`` is
remembered so that ``getUpdates`` answers 409 like the real API).
"""

from __future__ import annotations

import asyncio
import collections
import html
import html.parser
import io
import itertools
import json
import math
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web
from PIL import Image

T = TypeVar("T")

DEFAULT_TOKEN = "123:TEST"
MAX_TEXT_CHARS = 4096
MAX_CAPTION_CHARS = 1024
MAX_DOWNLOAD_BYTES = 20 * 1024 * 1024  # getFile refuses larger files
MAX_PHOTO_BYTES = 10 * 1024 * 1024
PHOTO_SIZES = (90, 320, 800, 1280)  # longest side of each PhotoSize Telegram generates
NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply "
    "markup are exactly the same as a current content and reply markup of the message"
)
CHAT_ACTIONS = frozenset(
    {
        "typing",
        "upload_photo",
        "record_video",
        "upload_video",
        "record_voice",
        "upload_voice",
        "upload_document",
        "choose_sticker",
        "find_location",
        "record_video_note",
        "upload_video_note",
    }
)
HTML_TAGS = {
    "b": "bold",
    "strong": "bold",
    "i": "italic",
    "em": "italic",
    "u": "underline",
    "ins": "underline",
    "s": "strikethrough",
    "strike": "strikethrough",
    "del": "strikethrough",
    "tg-spoiler": "spoiler",
    "span": "spoiler",
    "a": "text_link",
    "code": "code",
    "pre": "pre",
    "blockquote": "blockquote",
}
COMMAND_RE = re.compile(r"^/[A-Za-z0-9_]{1,32}(@[A-Za-z0-9_]{3,32})?")


class ApiError(Exception):
    """A Bot API error answer."""

    def __init__(
        self, code: int, description: str, parameters: dict[str, Any] | None = None
    ) -> None:
        super().__init__(description)
        self.code = code
        self.description = description
        self.parameters = parameters


@dataclass(frozen=True)
class Limits:
    """Telegram's limits on a bot's messages (see FakeTelegram.enforce_limits)."""

    overall: int = 30  # messages a second, all chats together
    private: float = 1.0  # messages a second to one private chat, on average
    private_burst: int = 3  # ... of which this many may come at once
    group: int = 20  # messages a minute to one group
    count_deletions: bool = False  # deleteMessage(s) count toward `overall` too


def _window_wait(window: collections.deque[float], now: float, limit: int, span: float) -> float:
    """Seconds until one more message fits in `window` (`limit` per `span` s); 0: now."""
    while window and window[0] <= now - span:
        window.popleft()
    if len(window) < limit:
        return 0.0
    return window[len(window) - limit] + span - now


def bad_request(description: str) -> ApiError:
    return ApiError(400, f"Bad Request: {description}")


@dataclass
class BotCall:
    """One Bot API request the bot made (``getUpdates`` polls are not recorded)."""

    method: str
    params: dict[str, Any]
    files: dict[str, tuple[str, bytes]]  # field -> (file name, bytes as uploaded)
    ok: bool = True
    error: str | None = None
    result: Any = None
    at: float = field(default_factory=time.monotonic)


@dataclass
class StoredFile:
    file_id: str
    file_unique_id: str
    data: bytes
    file_path: str


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


class _HtmlEntities(html.parser.HTMLParser):
    """Turns Telegram HTML into text + entities, refusing what the real server refuses."""

    def __init__(self) -> None:
        # Character references arrive apart from text, so a raw "<" in text is detectable.
        super().__init__(convert_charrefs=False)
        self.text = ""
        self.entities: list[dict[str, Any]] = []
        self.stack: list[tuple[str, int, dict[str, Any]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in HTML_TAGS and tag != "tg-emoji":
            raise bad_request(f'can\'t parse entities: Unsupported start tag "{tag}"')
        extra: dict[str, Any] = {}
        attributes = dict(attrs)
        if tag == "a":
            extra["url"] = attributes.get("href") or ""
        self.stack.append((tag, utf16_len(self.text), extra))

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1][0] != tag:
            raise bad_request(f'can\'t parse entities: Unexpected end tag "{tag}"')
        name, start, extra = self.stack.pop()
        length = utf16_len(self.text) - start
        if length and name in HTML_TAGS:
            self.entities.append(
                {"type": HTML_TAGS[name], "offset": start, "length": length, **extra}
            )

    def handle_data(self, data: str) -> None:
        if "<" in data:
            raise bad_request("can't parse entities: Unsupported start tag")
        self.text += data

    def handle_entityref(self, name: str) -> None:
        if name not in ("lt", "gt", "amp", "quot"):
            raise bad_request(f'can\'t parse entities: Unsupported HTML entity "&{name};"')
        self.text += html.unescape(f"&{name};")

    def handle_charref(self, name: str) -> None:
        self.text += html.unescape(f"&#{name};")

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        self.close()
        if self.rawdata:
            raise bad_request("can't parse entities: Unclosed start tag")
        if self.stack:
            raise bad_request(
                "can't parse entities: Can't find end tag corresponding to start tag "
                f'"{self.stack[-1][0]}"'
            )
        self.entities.sort(key=lambda e: (e["offset"], -e["length"]))
        return self.text, self.entities


def parse_html(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Parse HTML-formatted text as the Bot API does; raise ApiError like it."""
    parser = _HtmlEntities()
    parser.feed(text)
    return parser.finish()


def command_entities(text: str) -> list[dict[str, Any]]:
    match = COMMAND_RE.match(text)
    if not match:
        return []
    return [{"type": "bot_command", "offset": 0, "length": utf16_len(match.group(0))}]


class FakeTelegram:
    """A Bot API server on 127.0.0.1 with a test-driver API. See the module docstring."""

    def __init__(self, token: str = DEFAULT_TOKEN, *, username: str = "ComfyveilTestBot") -> None:
        self.token = token
        self.bot_user: dict[str, Any] = {
            "id": int(token.split(":", 1)[0]),
            "is_bot": True,
            "first_name": "Comfyveil Test",
            "username": username,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }
        self.sent: list[BotCall] = []
        self.updates: list[dict[str, Any]] = []
        self.commands: dict[str, list[dict[str, str]]] = {}
        self.callback_answers: dict[str, dict[str, Any]] = {}
        self.chat_actions: list[tuple[int, str]] = []
        self.webhook_url = ""
        self.url = ""
        self._chats: dict[int, dict[str, Any]] = {}
        self._users: dict[int, dict[str, Any]] = {}
        self._messages: dict[int, dict[int, dict[str, Any]]] = {}
        self._deleted: dict[int, list[int]] = {}
        self._next_message_id: dict[int, int] = {}
        self._files: dict[str, StoredFile] = {}
        self._files_by_path: dict[str, StoredFile] = {}
        self.file_downloads: list[str] = []  # paths fetched from /file/bot<token>/, in order
        self._pending_queries: set[str] = set()
        self._ids = itertools.count(1)
        self._update_ids = itertools.count(1)
        self._confirmed = 0  # update_id of the last update the bot confirmed
        self._poll_generation = 0
        self._changed = asyncio.Condition()
        self._new_update = asyncio.Event()
        self._rate_limited = 0
        self._retry_after: float = 1
        self._failures: list[tuple[str | None, ApiError]] = []
        self._held: asyncio.Event | None = None  # set: calls answer again (see `hold`)
        self._down = False  # every call answers 502 until `come_back` (see `go_down`)
        self._blocked_by: set[int] = set()  # users (private chats) that blocked the bot
        self._kicked_from: set[int] = set()  # groups that removed the bot
        self._migrated: dict[int, int] = {}  # group id -> the supergroup it became
        self._limits: Limits | None = None
        self._arrival_delay: tuple[float, random.Random] | None = None  # see delay_arrivals
        self._overall: collections.deque[float] = collections.deque()
        self._per_chat: dict[int, collections.deque[float]] = {}  # groups' last minute
        self._private: dict[int, tuple[float, float]] = {}  # private chats' (tokens, when)
        self.limited: list[BotCall] = []  # calls answered 429 by enforce_limits
        self._runner: web.AppRunner | None = None
        self.app = web.Application(client_max_size=60 * 1024 * 1024)
        self.app.router.add_route("*", "/bot{token}/{method}", self._handle_method)
        self.app.router.add_get("/file/bot{token}/{path:.+}", self._handle_file)

    # ------------------------------------------------------------------ life cycle

    @property
    def base_url(self) -> str:
        """For ``ApplicationBuilder.base_url`` (PTB appends the token)."""
        return f"{self.url}/bot"

    @property
    def base_file_url(self) -> str:
        """For ``ApplicationBuilder.base_file_url`` (PTB appends the token)."""
        return f"{self.url}/file/bot"

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def close(self) -> None:
        self.release()
        self._poll_generation += 1
        self._new_update.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeTelegram:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ test driver

    def user_sends(
        self,
        user_id: int,
        text: str | None = None,
        *,
        chat_id: int | None = None,
        chat_type: str = "private",
        photo: bytes | None = None,
        document: tuple[bytes, str, str] | None = None,
        reply_to_message_id: int | None = None,
        caption: str | None = None,
        first_name: str | None = None,
        username: str | None = None,
        language_code: str | None = None,
    ) -> dict[str, Any]:
        """Queue a message from a user as an update; return the Message object.

        ``language_code`` is the user's app language (IETF tag, "en" unless given); like
        Telegram, the latest message carries the user's current one.

        Commands get a ``bot_command`` entity (also in captions), a photo is stored
        like Telegram does (several PhotoSizes, retrievable with getFile).
        """
        user = self._user(user_id, first_name, username)
        if language_code is not None:
            user["language_code"] = language_code
        chat = self._chat(chat_id if chat_id is not None else user_id, chat_type, user)
        message = self._new_message(chat, dict(user))
        if photo is not None:
            message["photo"] = self._store_photo(photo, "photos")
        if document is not None:
            data, name, mime = document
            stored = self._store_file(data, f"documents/{name}")
            message["document"] = {
                "file_id": stored.file_id,
                "file_unique_id": stored.file_unique_id,
                "file_name": name,
                "mime_type": mime,
                "file_size": len(data),
            }
        if photo is not None or document is not None:
            caption = caption if caption is not None else text
            if caption:
                message["caption"] = caption
                if entities := command_entities(caption):
                    message["caption_entities"] = entities
        elif text is not None:
            message["text"] = text
            if entities := command_entities(text):
                message["entities"] = entities
        else:
            raise ValueError("user_sends needs text, a photo or a document")
        if reply_to_message_id is not None:
            replied = self._get_message(chat["id"], reply_to_message_id)
            message["reply_to_message"] = replied
        self._store_message(message)
        self._push_update({"message": message})
        return message

    def user_presses(
        self, user_id: int, message_id: int, callback_data: str, *, chat_id: int | None = None
    ) -> str:
        """Queue a callback query (an inline button press); return its query id."""
        user = self._user(user_id, None, None)
        chat_key = chat_id if chat_id is not None else user_id
        message = self._get_message(chat_key, message_id)
        query_id = str(4_000_000_000_000 + next(self._ids))
        self._pending_queries.add(query_id)
        self._push_update(
            {
                "callback_query": {
                    "id": query_id,
                    "from": user,
                    "message": message,
                    "chat_instance": str(-abs(chat_key) * 7919),
                    "data": callback_data,
                }
            }
        )
        return query_id

    def open_chat(
        self, chat_id: int, chat_type: str = "private", *, user_id: int | None = None
    ) -> dict[str, Any]:
        """A chat the bot may write to, as if its user (``user_id``, for a private chat
        the chat id) had talked to the bot before; no update is queued."""
        user = self._user(user_id if user_id is not None else abs(chat_id), None, None)
        return self._chat(chat_id, chat_type, user)

    def block_bot(self, user_id: int) -> None:
        """The user blocks the bot: sends to their private chat answer 403."""
        self._blocked_by.add(user_id)

    def kick_bot(self, chat_id: int) -> None:
        """The bot is removed from a group: sends there answer 403."""
        self._kicked_from.add(chat_id)

    def migrate_group(self, chat_id: int, new_chat_id: int, *, by_user: int = 1) -> None:
        """Upgrade a group to a supergroup with a new id, as Telegram does: the bot gets
        the two service messages, and any call to the old id answers 400 with
        ``parameters.migrate_to_chat_id``."""
        old = self._chats.get(chat_id)
        if old is None or old["type"] != "group":
            raise ValueError(f"chat {chat_id} is not a group")
        user = self._user(by_user, None, None)
        new = self._chat(new_chat_id, "supergroup", user)
        new["title"] = old["title"]
        self._migrated[chat_id] = new_chat_id
        to = self._new_message(old, user)
        to["migrate_to_chat_id"] = new_chat_id
        self._store_message(to)
        self._push_update({"message": to})
        from_ = self._new_message(new, user)
        from_.update(sender_chat=old, migrate_from_chat_id=chat_id)
        self._store_message(from_)
        self._push_update({"message": from_})

    def user_deletes(self, chat_id: int, message_id: int) -> None:
        """The user deletes a message for everyone: the bot's later edits and deletes of it
        answer "message to edit not found" / "message to delete not found"."""
        if self._messages.get(chat_id, {}).pop(message_id, None) is None:
            raise ValueError(f"no message {message_id} in chat {chat_id}")

    def rate_limit_next(self, n: int, retry_after: float = 1) -> None:
        """Answer the next ``n`` bot calls (not getUpdates) with 429 and ``retry_after``.

        The real API sends whole seconds; a fraction keeps tests fast.
        """
        self._rate_limited = n
        self._retry_after = retry_after

    def delay_arrivals(self, most: float, *, seed: int = 0) -> None:
        """From now on each call reaches the server up to `most` seconds after it was
        sent, unevenly (seeded): a slow path, as a loaded host or an anon circuit makes
        the real one, where Telegram counts a message toward its limits when it arrives,
        not when it left. `most` 0: the path is quick again."""
        self._arrival_delay = (most, random.Random(seed)) if most > 0 else None

    def enforce_limits(self, limits: Limits | None = None) -> None:
        """From now on, answer messages over Telegram's limits with 429 (see the module
        docstring); `limits` changes the numbers (defaults: Telegram's)."""
        self._limits = limits or Limits()

    def _over_limit(self, method: str, params: dict[str, Any]) -> ApiError | None:
        """429 when this message would break a limit, else None (and it is counted)."""
        limits = self._limits
        name = method.lower()
        if limits is None or name == "sendchataction":
            return None
        deletion = name.startswith("delete") and limits.count_deletions
        if not (deletion or name.startswith(("send", "edit"))):
            return None
        now = time.monotonic()
        waits = [_window_wait(self._overall, now, limits.overall, 1.0)]
        chat_id = _int(params, "chat_id", 0) if params.get("chat_id") is not None else None
        chat_window = None
        tokens: float | None = None
        if chat_id is not None and name.startswith("send"):
            chat = self._chats.get(chat_id)
            if chat is not None and chat.get("type") == "private":
                # a bucket of `private_burst` messages, refilled at `private` a second
                held, at = self._private.get(chat_id, (float(limits.private_burst), now))
                tokens = min(float(limits.private_burst), held + (now - at) * limits.private)
                if tokens < 1.0:
                    waits.append((1.0 - tokens) / limits.private)
            else:
                chat_window = self._per_chat.setdefault(chat_id, collections.deque())
                waits.append(_window_wait(chat_window, now, limits.group, 60.0))
        wait = max(waits)
        if wait > 0:
            seconds = max(1, math.ceil(wait))  # Telegram says whole seconds
            return ApiError(
                429, f"Too Many Requests: retry after {seconds}", {"retry_after": seconds}
            )
        self._overall.append(now)
        if chat_window is not None:
            chat_window.append(now)
        if tokens is not None and chat_id is not None:
            self._private[chat_id] = (tokens - 1.0, now)
        return None

    def hold(self) -> None:
        """Stop answering: every call (getUpdates too) waits unread until `release`, as
        when the Bot API times out; a call whose client gave up meanwhile is dropped."""
        if self._held is None:
            self._held = asyncio.Event()

    def release(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.set()

    def go_down(self) -> None:
        """An outage: every call, getUpdates too, answers 502 Bad Gateway with the HTML
        page of the proxy in front of the Bot API, until `come_back`. Copies what
        Telegram's outages look like to a client: nginx at api.telegram.org answers 502
        with its own text/html page (no JSON body, so PTB cannot parse it) when the Bot
        API server behind it is down, and a call it answers so never reached the Bot API
        (so it is not recorded). A Bot API that answers nothing at all is `hold`."""
        self._down = True

    def come_back(self) -> None:
        self._down = False

    def fail_next(
        self,
        method: str | None,
        code: int,
        description: str,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        """Answer the next call of ``method`` (any method but getUpdates if None) with
        this error (``parameters``: its ResponseParameters, e.g. ``{"retry_after": 1}``
        with a 429); a getUpdates failure must name getUpdates."""
        self._failures.append((method, ApiError(code, description, parameters)))

    def messages(self, chat_id: int) -> list[dict[str, Any]]:
        """The chat as a user sees it now: every message not deleted, edits applied."""
        return [dict(m) for m in self._messages.get(chat_id, {}).values()]

    def bot_messages(self, chat_id: int) -> list[dict[str, Any]]:
        return [m for m in self.messages(chat_id) if m["from"]["id"] == self.bot_user["id"]]

    def deleted(self, chat_id: int) -> list[int]:
        return list(self._deleted.get(chat_id, []))

    def calls(self, method: str | None = None, *, ok: bool | None = True) -> list[BotCall]:
        """Recorded calls of ``method`` (all methods if None); by default only successful ones."""
        return [
            c
            for c in self.sent
            if (method is None or c.method == method) and (ok is None or c.ok == ok)
        ]

    def file_bytes(self, file_id: str) -> bytes:
        return self._files[file_id].data

    async def wait_for(
        self,
        predicate: Callable[[list[BotCall]], T],
        timeout: float = 15.0,
    ) -> T:
        """Wait until ``predicate(self.sent)`` is truthy and return its value."""
        deadline = asyncio.get_running_loop().time() + timeout
        async with self._changed:
            while True:
                value = predicate(self.sent)
                if value:
                    return value
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    recent = ", ".join(f"{c.method}{'' if c.ok else '!'}" for c in self.sent[-10:])
                    raise AssertionError(
                        f"condition not met within {timeout} s; last calls: {recent or 'none'}"
                    )
                try:
                    await asyncio.wait_for(self._changed.wait(), remaining)
                except TimeoutError:
                    pass

    @property
    def polls(self) -> int:
        """getUpdates calls taken so far, and one at close (each ends the poll open).
        An observation for the tests only: what the server answers is unchanged."""
        return self._poll_generation

    async def wait_for_call(
        self,
        method: str,
        *,
        chat_id: int | None = None,
        count: int = 1,
        timeout: float = 15.0,
    ) -> BotCall:
        """Wait for the ``count``-th successful call of ``method`` (to ``chat_id``)."""

        def found(calls: list[BotCall]) -> BotCall | None:
            matching = [
                c
                for c in calls
                if c.ok
                and c.method == method
                and (chat_id is None or str(c.params.get("chat_id")) == str(chat_id))
            ]
            return matching[count - 1] if len(matching) >= count else None

        return await self.wait_for(found, timeout)

    # ------------------------------------------------------------------ state helpers

    def _user(self, user_id: int, first_name: str | None, username: str | None) -> dict[str, Any]:
        user = self._users.get(user_id)
        if user is None:
            user = {
                "id": user_id,
                "is_bot": False,
                "first_name": first_name or f"User{user_id}",
                "username": username or f"user{user_id}",
                "language_code": "en",
            }
            self._users[user_id] = user
        return user

    def _chat(self, chat_id: int, chat_type: str, user: dict[str, Any]) -> dict[str, Any]:
        chat = self._chats.get(chat_id)
        if chat is None:
            if chat_type == "private":
                chat = {
                    "id": chat_id,
                    "type": "private",
                    "first_name": user["first_name"],
                    "username": user["username"],
                }
            elif chat_type in ("group", "supergroup", "channel"):
                chat = {"id": chat_id, "type": chat_type, "title": f"Chat {chat_id}"}
            else:
                raise ValueError(f"unknown chat type {chat_type!r}")
            self._chats[chat_id] = chat
            self._messages[chat_id] = {}
        return chat

    def _new_message(self, chat: dict[str, Any], sender: dict[str, Any]) -> dict[str, Any]:
        chat_id = chat["id"]
        message_id = self._next_message_id.get(chat_id, 1)
        self._next_message_id[chat_id] = message_id + 1
        return {"message_id": message_id, "from": sender, "chat": chat, "date": int(time.time())}

    def _store_message(self, message: dict[str, Any]) -> None:
        self._messages[message["chat"]["id"]][message["message_id"]] = message

    def _get_message(self, chat_id: int, message_id: int) -> dict[str, Any]:
        message = self._messages.get(chat_id, {}).get(message_id)
        if message is None:
            raise ValueError(f"no message {message_id} in chat {chat_id}")
        # A nested reply_to_message never carries its own reply, like the real API.
        return {k: v for k, v in message.items() if k != "reply_to_message"}

    def _push_update(self, body: dict[str, Any]) -> None:
        self.updates.append({"update_id": next(self._update_ids), **body})
        self._new_update.set()

    def _store_file(self, data: bytes, path: str) -> StoredFile:
        n = next(self._ids)
        stored = StoredFile(
            file_id=f"BQACAgIAAxkBAAI{n:08d}",
            file_unique_id=f"AgAD{n:06d}",
            data=data,
            file_path=f"{path.split('/', 1)[0]}/file_{n}{_suffix(path)}",
        )
        self._files[stored.file_id] = stored
        self._files_by_path[stored.file_path] = stored
        return stored

    def _store_photo(self, data: bytes, folder: str) -> list[dict[str, Any]]:
        """Store a photo as Telegram does: re-encoded JPEGs at several sizes."""
        if len(data) > MAX_PHOTO_BYTES:
            raise bad_request("PHOTO_INVALID_DIMENSIONS")
        try:
            with Image.open(io.BytesIO(data)) as image:
                image.load()
                width, height = image.size
                if width + height > 10000 or max(width, height) > 20 * min(width, height):
                    raise bad_request("PHOTO_INVALID_DIMENSIONS")
                rgb = image.convert("RGB")
        except (OSError, SyntaxError, ValueError) as exc:
            raise bad_request("IMAGE_PROCESS_FAILED") from exc
        sizes = []
        for limit in PHOTO_SIZES:
            scale = min(1.0, limit / max(width, height))
            size = (max(1, round(width * scale)), max(1, round(height * scale)))
            if sizes and (size[0], size[1]) == (sizes[-1]["width"], sizes[-1]["height"]):
                break
            out = io.BytesIO()
            rgb.resize(size).save(out, "JPEG", quality=87)
            stored = self._store_file(out.getvalue(), f"{folder}/p.jpg")
            sizes.append(
                {
                    "file_id": stored.file_id,
                    "file_unique_id": stored.file_unique_id,
                    "file_size": len(stored.data),
                    "width": size[0],
                    "height": size[1],
                }
            )
            if scale == 1.0:
                break
        return sizes

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------------ HTTP

    async def _handle_file(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["token"] != self.token:
            return web.json_response(
                {"ok": False, "error_code": 401, "description": "Unauthorized"}, status=401
            )
        stored = self._files_by_path.get(request.match_info["path"])
        if stored is None:
            return web.json_response(
                {"ok": False, "error_code": 404, "description": "Not Found"}, status=404
            )
        self.file_downloads.append(request.match_info["path"])
        return web.Response(body=stored.data, content_type="application/octet-stream")

    async def _handle_method(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != self.token:
            return _error(ApiError(401, "Unauthorized"))
        if self._held is not None:
            await self._held.wait()
            if request.transport is None or request.transport.is_closing():
                return _error(ApiError(504, "Gateway Timeout"))  # nobody reads it
        if self._down:
            return web.Response(
                status=502, content_type="text/html",
                text="<html><head><title>502 Bad Gateway</title></head><body>"
                "<center><h1>502 Bad Gateway</h1></center><hr><center>nginx</center>"
                "</body></html>",
            )
        name = request.match_info["method"]
        handler = getattr(self, f"_api_{name.lower()}", None)
        if handler is None:
            return _error(ApiError(404, "Not Found"))
        if self._arrival_delay is not None:
            most, draws = self._arrival_delay
            await asyncio.sleep(draws.uniform(0.0, most))
        try:
            params, files = await _read_params(request)
        except ConnectionResetError:
            # The client went away mid-request (a process killed while it sent): like any
            # HTTP server, the Bot API never acts on a call whose body did not arrive, and
            # nobody is left to read an answer. Dropped here too, without a traceback.
            raise web.HTTPBadRequest() from None
        if name.lower() == "getupdates":
            try:
                # Only failures scripted for getUpdates by name: a long poll is not a
                # call the bot makes, and "any method" failures are meant for those.
                for i, (wanted, error) in enumerate(self._failures):
                    if wanted is not None and wanted.lower() == "getupdates":
                        del self._failures[i]
                        raise error
                return _ok(await self._api_getupdates(params, files))
            except ApiError as exc:
                return _error(exc)
        call = BotCall(method=name, params=params, files=files)
        self.sent.append(call)
        try:
            scripted = self._take_failure(name)
            failure = scripted or self._over_limit(name, params)
            if failure is not None:
                # (bookkeeping, no behaviour: a test reads which 429s the limits gave,
                # as Telegram's own answers do not say)
                if scripted is None:
                    self.limited.append(call)
                raise failure
            call.result = handler(params, files)
        except ApiError as exc:
            call.ok = False
            call.error = exc.description
            await self._notify()
            return _error(exc)
        await self._notify()
        return _ok(call.result)

    def _take_failure(self, method: str) -> ApiError | None:
        if self._rate_limited > 0:
            self._rate_limited -= 1
            wait = self._retry_after
            shown = int(wait) if float(wait).is_integer() else wait
            return ApiError(429, f"Too Many Requests: retry after {shown}", {"retry_after": shown})
        for i, (wanted, error) in enumerate(self._failures):
            if wanted is None or wanted.lower() == method.lower():
                del self._failures[i]
                return error
        return None

    # ------------------------------------------------------------------ methods

    async def _api_getupdates(self, params: dict[str, Any], _files: Any) -> list[dict[str, Any]]:
        if self.webhook_url:
            raise ApiError(
                409,
                "Conflict: can't use getUpdates method while webhook is active; use "
                "deleteWebhook to delete the webhook first",
            )
        offset = _int(params, "offset", 0)
        limit = min(max(_int(params, "limit", 100), 1), 100)
        timeout = max(_float(params, "timeout", 0), 0)
        if offset > 0:
            self._confirmed = max(self._confirmed, offset - 1)
        elif offset < 0:
            pending = [u for u in self.updates if u["update_id"] > self._confirmed]
            keep = pending[offset:]
            if keep:
                self._confirmed = keep[0]["update_id"] - 1
        self._poll_generation += 1
        generation = self._poll_generation
        self._new_update.set()  # an older long poll wakes up and answers 409
        await asyncio.sleep(0)
        deadline = time.monotonic() + timeout
        while True:
            self.updates = [u for u in self.updates if u["update_id"] > self._confirmed]
            if self.updates:
                return self.updates[:limit]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self._new_update.clear()
            try:
                await asyncio.wait_for(self._new_update.wait(), remaining)
            except TimeoutError:
                return []
            if generation != self._poll_generation:
                raise ApiError(
                    409,
                    "Conflict: terminated by other getUpdates request; make sure that only "
                    "one bot instance is running",
                )

    def _api_getme(self, params: dict[str, Any], files: Any) -> dict[str, Any]:
        return self.bot_user

    def _api_deletewebhook(self, params: dict[str, Any], files: Any) -> bool:
        self.webhook_url = ""
        if _bool(params, "drop_pending_updates"):
            self._confirmed = max([self._confirmed] + [u["update_id"] for u in self.updates])
            self.updates = []
        return True

    def _api_setwebhook(self, params: dict[str, Any], files: Any) -> bool:
        self.webhook_url = _str(params, "url", required=True)
        return True

    def _api_getwebhookinfo(self, params: dict[str, Any], files: Any) -> dict[str, Any]:
        pending = len([u for u in self.updates if u["update_id"] > self._confirmed])
        return {
            "url": self.webhook_url,
            "has_custom_certificate": False,
            "pending_update_count": pending,
        }

    def _command_key(self, params: dict[str, Any]) -> str:
        scope = _json(params, "scope") or {"type": "default"}
        return json.dumps([scope, params.get("language_code", "")], sort_keys=True)

    def _api_setmycommands(self, params: dict[str, Any], files: Any) -> bool:
        commands = _json(params, "commands")
        if not isinstance(commands, list):
            raise bad_request('parameter "commands" is required')
        if len(commands) > 100:
            raise bad_request("too many commands specified")
        for entry in commands:
            command = str(entry.get("command", "")).lstrip("/")
            if not re.fullmatch(r"[a-z0-9_]{1,32}", command):
                raise bad_request("BOT_COMMAND_INVALID")
            if not 1 <= len(str(entry.get("description", ""))) <= 256:
                raise bad_request("command description is empty")
        self.commands[self._command_key(params)] = [
            {"command": str(e["command"]).lstrip("/"), "description": str(e["description"])}
            for e in commands
        ]
        return True

    def _api_getmycommands(self, params: dict[str, Any], files: Any) -> list[dict[str, str]]:
        return self.commands.get(self._command_key(params), [])

    def _api_deletemycommands(self, params: dict[str, Any], files: Any) -> bool:
        self.commands.pop(self._command_key(params), None)
        return True

    def _target_chat(self, params: dict[str, Any]) -> dict[str, Any]:
        raw = params.get("chat_id")
        if raw in (None, ""):
            raise bad_request("chat_id is empty")
        try:
            chat_id = int(raw)
        except (TypeError, ValueError):
            raise bad_request("chat not found") from None
        chat = self._chats.get(chat_id)
        if chat is None:
            raise bad_request("chat not found")
        if chat_id in self._migrated:
            raise ApiError(
                400,
                "Bad Request: group chat was upgraded to a supergroup chat",
                {"migrate_to_chat_id": self._migrated[chat_id]},
            )
        if chat_id in self._kicked_from:
            raise ApiError(403, f"Forbidden: bot was kicked from the {chat['type']} chat")
        if chat["type"] == "private" and chat_id in self._blocked_by:
            raise ApiError(403, "Forbidden: bot was blocked by the user")
        return chat

    def _outgoing(self, params: dict[str, Any]) -> dict[str, Any]:
        """A new bot message in the target chat, with reply and markup applied."""
        chat = self._target_chat(params)
        message = self._new_message(chat, self.bot_user)
        reply = _json(params, "reply_parameters") or {}
        reply_id = reply.get("message_id") or _int(params, "reply_to_message_id", 0)
        if reply_id:
            try:
                message["reply_to_message"] = self._get_message(chat["id"], int(reply_id))
            except ValueError:
                if not (
                    reply.get("allow_sending_without_reply")
                    or _bool(params, "allow_sending_without_reply")
                ):
                    raise bad_request("message to be replied not found") from None
        markup = _reply_markup(params)
        if markup is not None:
            message["reply_markup"] = markup
        return message

    def _formatted(
        self, params: dict[str, Any], key: str, limit: int, too_long: str
    ) -> tuple[str, list[dict[str, Any]]]:
        raw = _str(params, key)
        mode = str(params.get("parse_mode") or "")
        if mode.upper() == "HTML":
            text, entities = parse_html(raw)
        else:
            text = raw
            entities = _json(params, f"{'caption_' if key == 'caption' else ''}entities") or []
        if utf16_len(text.strip()) > limit:
            raise bad_request(too_long)
        return text, entities

    def _api_sendmessage(self, params: dict[str, Any], files: Any) -> dict[str, Any]:
        message = self._outgoing(params)
        text, entities = self._formatted(params, "text", MAX_TEXT_CHARS, "message is too long")
        if not text.strip():
            raise bad_request("message text is empty")
        message["text"] = text
        if entities:
            message["entities"] = entities
        self._store_message(message)
        return message

    def _api_sendchataction(self, params: dict[str, Any], files: Any) -> bool:
        chat = self._target_chat(params)
        action = _str(params, "action")
        if action not in CHAT_ACTIONS:
            raise bad_request("wrong parameter action in request")
        self.chat_actions.append((chat["id"], action))
        return True

    def _editable(self, params: dict[str, Any]) -> dict[str, Any]:
        if params.get("inline_message_id"):
            raise bad_request("inline messages are not supported by this fake")
        chat = self._target_chat(params)
        message_id = _int(params, "message_id", 0)
        if not message_id:
            raise bad_request("message identifier is not specified")
        message = self._messages[chat["id"]].get(message_id)
        if message is None:
            raise bad_request("message to edit not found")
        if message["from"]["id"] != self.bot_user["id"]:
            raise bad_request("message can't be edited")
        return message

    def _finish_edit(
        self, message: dict[str, Any], changes: dict[str, Any], params: dict[str, Any]
    ) -> dict[str, Any]:
        markup = _reply_markup(params)
        updated = {k: v for k, v in message.items() if k != "reply_markup"}
        updated.update({k: v for k, v in changes.items() if v is not None})
        for key, value in changes.items():
            if value is None:
                updated.pop(key, None)
        if markup is not None:
            updated["reply_markup"] = markup
        compare = ("text", "entities", "caption", "caption_entities", "reply_markup")
        old = {k: message.get(k) for k in (*compare, "photo", "document", "video", "animation")}
        new = {k: updated.get(k) for k in old}
        if old == new and "media" not in changes:
            raise bad_request(NOT_MODIFIED.removeprefix("Bad Request: "))
        updated["edit_date"] = int(time.time())
        self._store_message(updated)
        return updated

    def _api_editmessagetext(self, params: dict[str, Any], files: Any) -> dict[str, Any]:
        message = self._editable(params)
        if "text" not in message:
            raise bad_request("there is no text in the message to edit")
        text, entities = self._formatted(params, "text", MAX_TEXT_CHARS, "MESSAGE_TOO_LONG")
        if not text.strip():
            raise bad_request("message text is empty")
        return self._finish_edit(message, {"text": text, "entities": entities or None}, params)

    def _api_editmessagecaption(self, params: dict[str, Any], files: Any) -> dict[str, Any]:
        message = self._editable(params)
        if not any(k in message for k in ("photo", "document", "video", "animation")):
            raise bad_request("there is no caption in the message to edit")
        caption, entities = self._formatted(
            params, "caption", MAX_CAPTION_CHARS, "message caption is too long"
        )
        return self._finish_edit(
            message, {"caption": caption or None, "caption_entities": entities or None}, params
        )

    def _api_editmessagereplymarkup(self, params: dict[str, Any], files: Any) -> dict[str, Any]:
        message = self._editable(params)
        return self._finish_edit(message, {}, params)

    def _api_editmessagemedia(
        self, params: dict[str, Any], files: dict[str, tuple[str, bytes]]
    ) -> dict[str, Any]:
        message = self._editable(params)
        if "text" in message:
            raise bad_request("there is no media in the message to edit")
        media = _json(params, "media")
        if not isinstance(media, dict) or media.get("type") not in (
            "photo",
            "document",
            "video",
            "animation",
        ):
            raise bad_request("can't parse InputMedia: media not found")
        kind = media["type"]
        source = str(media.get("media", ""))
        if source.startswith("attach://"):
            part = files.get(source.removeprefix("attach://"))
            if part is None:
                raise bad_request("can't parse InputMedia: media not found")
            payload = self._media_object(kind, part, media)
        else:
            payload = self._existing_media(kind, source)
        changes: dict[str, Any] = {k: None for k in ("photo", "document", "video", "animation")}
        changes[kind] = payload
        if kind == "animation":
            changes["document"] = _animation_document(payload)
        sub = {"parse_mode": media.get("parse_mode"), "caption": media.get("caption", "")}
        caption, entities = self._formatted(
            sub, "caption", MAX_CAPTION_CHARS, "message caption is too long"
        )
        changes["caption"] = caption or None
        changes["caption_entities"] = entities or None
        changes["media"] = True
        updated = self._finish_edit(message, changes, params)
        updated.pop("media", None)
        self._store_message(updated)
        return updated

    def _api_deletemessage(self, params: dict[str, Any], files: Any) -> bool:
        chat = self._target_chat(params)
        message_id = _int(params, "message_id", 0)
        if self._messages[chat["id"]].pop(message_id, None) is None:
            raise bad_request("message to delete not found")
        self._deleted.setdefault(chat["id"], []).append(message_id)
        return True

    def _api_answercallbackquery(self, params: dict[str, Any], files: Any) -> bool:
        query_id = _str(params, "callback_query_id")
        if query_id not in self._pending_queries:
            raise bad_request(
                "query is too old and response timeout expired or query ID is invalid"
            )
        self._pending_queries.discard(query_id)
        self.callback_answers[query_id] = {
            "text": params.get("text"),
            "show_alert": _bool(params, "show_alert"),
        }
        return True

    def _api_getfile(self, params: dict[str, Any], files: Any) -> dict[str, Any]:
        stored = self._files.get(_str(params, "file_id"))
        if stored is None:
            raise bad_request("invalid file_id")
        if len(stored.data) > MAX_DOWNLOAD_BYTES:
            raise bad_request("file is too big")
        return {
            "file_id": stored.file_id,
            "file_unique_id": stored.file_unique_id,
            "file_size": len(stored.data),
            "file_path": stored.file_path,
        }

    def _existing_media(self, kind: str, source: str) -> Any:
        if source.startswith(("http://", "https://")):
            raise bad_request("wrong file identifier/HTTP URL specified")
        stored = self._files.get(source)
        if stored is None:
            raise bad_request("wrong file identifier/HTTP URL specified")
        if kind == "photo":
            return self._store_photo(stored.data, "photos")
        return self._media_object(kind, ("file", stored.data), {})

    def _media_object(self, kind: str, part: tuple[str, bytes], params: Mapping[str, Any]) -> Any:
        name, data = part
        if kind == "photo":
            return self._store_photo(data, "photos")
        folder = {"document": "documents", "video": "videos", "animation": "animations"}[kind]
        stored = self._store_file(data, f"{folder}/{name}")
        obj: dict[str, Any] = {
            "file_id": stored.file_id,
            "file_unique_id": stored.file_unique_id,
            "file_name": name,
            "mime_type": _mime(name),
            "file_size": len(data),
        }
        if kind in ("video", "animation"):
            obj.update(
                width=_int(params, "width", 0),
                height=_int(params, "height", 0),
                duration=_int(params, "duration", 0),
            )
        return obj

    def _send_media(
        self, kind: str, params: dict[str, Any], files: dict[str, tuple[str, bytes]]
    ) -> dict[str, Any]:
        message = self._outgoing(params)
        if kind in files:
            payload = self._media_object(kind, files[kind], params)
        else:
            source = _str(params, kind)
            if not source:
                raise bad_request(f"there is no {kind} in the request")
            payload = self._existing_media(kind, source)
        message[kind] = payload
        if kind == "animation":
            message["document"] = _animation_document(payload)
        # sendPhoto, sendVideo and sendAnimation take has_spoiler; the Message then says
        # has_media_spoiler. sendDocument has no such parameter (the real server ignores
        # parameters a method does not have), so a document is never blurred.
        if kind in ("photo", "video", "animation") and _bool(params, "has_spoiler"):
            message["has_media_spoiler"] = True
        caption, entities = self._formatted(
            params, "caption", MAX_CAPTION_CHARS, "message caption is too long"
        )
        if caption:
            message["caption"] = caption
        if entities:
            message["caption_entities"] = entities
        self._store_message(message)
        return message

    def _api_sendphoto(self, params: dict[str, Any], files: Any) -> dict[str, Any]:
        return self._send_media("photo", params, files)

    def _api_senddocument(self, params: dict[str, Any], files: Any) -> dict[str, Any]:
        return self._send_media("document", params, files)

    def _api_sendvideo(self, params: dict[str, Any], files: Any) -> dict[str, Any]:
        return self._send_media("video", params, files)

    def _api_sendanimation(self, params: dict[str, Any], files: Any) -> dict[str, Any]:
        return self._send_media("animation", params, files)


# ---------------------------------------------------------------------- wire helpers


def _ok(result: Any) -> web.Response:
    return web.json_response({"ok": True, "result": result})


def _error(exc: ApiError) -> web.Response:
    body: dict[str, Any] = {"ok": False, "error_code": exc.code, "description": exc.description}
    if exc.parameters:
        body["parameters"] = exc.parameters
    return web.json_response(body, status=exc.code)


async def _read_params(
    request: web.Request,
) -> tuple[dict[str, Any], dict[str, tuple[str, bytes]]]:
    params: dict[str, Any] = dict(request.query)
    files: dict[str, tuple[str, bytes]] = {}
    if request.method != "POST" or not request.can_read_body:
        return params, files
    if request.content_type == "application/json":
        body = await request.json()
        if isinstance(body, dict):
            params.update(body)
    elif request.content_type == "multipart/form-data":
        reader = await request.multipart()
        async for part in reader:
            if part.name is None:
                continue
            if part.filename is not None:
                files[part.name] = (part.filename, bytes(await part.read()))
            else:
                params[part.name] = await part.text()
    else:
        form = await request.post()
        params.update({k: v for k, v in form.items() if isinstance(v, str)})
    return params, files


def _str(params: Mapping[str, Any], name: str, *, required: bool = False) -> str:
    value = params.get(name)
    if value is None:
        if required:
            raise bad_request(f'parameter "{name}" is required')
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def _int(params: Mapping[str, Any], name: str, default: int) -> int:
    value = params.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise bad_request(f"invalid {name} specified") from None


def _float(params: Mapping[str, Any], name: str, default: float) -> float:
    value = params.get(name)
    if value in (None, ""):
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        raise bad_request(f"invalid {name} specified") from None


def _bool(params: Mapping[str, Any], name: str) -> bool:
    value = params.get(name)
    return value is True or str(value).lower() in ("true", "1")


def _json(params: Mapping[str, Any], name: str) -> Any:
    value = params.get(name)
    if isinstance(value, str):
        if not value:
            return None
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise bad_request(f"can't parse {name} JSON object") from None
    return value


def _reply_markup(params: Mapping[str, Any]) -> dict[str, Any] | None:
    markup = _json(params, "reply_markup")
    if not isinstance(markup, dict) or "inline_keyboard" not in markup:
        return None  # only inline keyboards are echoed in Message objects
    for row in markup["inline_keyboard"]:
        for button in row:
            if not button.get("text"):
                raise bad_request("text buttons are unallowed in the inline keyboard")
            data = button.get("callback_data")
            if data is not None and not 1 <= len(str(data).encode()) <= 64:
                raise bad_request("BUTTON_DATA_INVALID")
    return markup


def _animation_document(animation: dict[str, Any]) -> dict[str, Any]:
    keys = ("file_id", "file_unique_id", "file_name", "mime_type", "file_size")
    return {k: animation[k] for k in keys if k in animation}


def _suffix(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return "." + name.rsplit(".", 1)[1].lower() if "." in name else ""


def _mime(name: str) -> str:
    return {
        ".png": "image/png",
        ".jpg": "image/jpeg",
        ".jpeg": "image/jpeg",
        ".webp": "image/webp",
        ".gif": "image/gif",
        ".mp4": "video/mp4",
        ".webm": "video/webm",
    }.get(_suffix(name), "application/octet-stream")
