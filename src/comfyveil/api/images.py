"""``POST /v1/images/generations`` and ``/v1/images/edits``: the request read as OpenAI's
SDK sends it, turned into the values of a command's workflow, queued through the desk
(its limits and content policy, as the chat and the pages), and answered once every job
has finished. The prompt and images are never logged."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import re
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import BodyPartReader, web

from comfyveil import errors, images
from comfyveil import policy as policy_mod
from comfyveil.api import links
from comfyveil.api.context import ACCOUNT, ApiServices, caller
from comfyveil.api.errors import QUEUE_RETRY_SECONDS, ApiError, bad_request, from_usage
from comfyveil.desk import access as access_mod
from comfyveil.desk import availability, failures, registry, submit
from comfyveil.i18n import _
from comfyveil.images import MIMES
from comfyveil.store import jobs

MAX_N = 10  # OpenAI's own bound on n
MAX_JSON = 256 * 1024  # a generation request: the prompt and a few fields
MAX_FIELD = 64 * 1024  # a text field of an edit request
MAX_PARTS = 16  # fields and images of one edit request
MAX_IMAGES = 4  # images of one edit request (no shipped command takes more than one)
SIZE = re.compile(r"^\s*(\d{1,5})\s*x\s*(\d{1,5})\s*$")
FORMATS = ("b64_json", "url")
IDEMPOTENCY = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")


@dataclass
class Ask:
    """One request, read."""

    model: str = ""
    prompt: str | None = None
    n: Any = 1
    size: Any = None
    response_format: Any = None
    images: list[jobs.InputImage] = field(default_factory=list)
    mask: bool = False


# Requests of one account answered at once: each may hold up to MAX_N jobs' outputs in
# memory as base64, and a retry with the same Idempotency-Key costs no quota, so without
# this bound one account could have any number of answers built at once.
MAX_ANSWERING = 4
_answering: Counter[int] = Counter()
_SLOT = web.RequestKey("api_answering", int)


def answering(account_id: int) -> int:
    """How many requests of this account are being answered now (in this process)."""
    return _answering[account_id]


def _enter(request: web.Request) -> None:
    """Take one of the account's answer slots, or refuse with 429."""
    account_id = request[ACCOUNT].id
    if _answering[account_id] >= MAX_ANSWERING:
        raise ApiError(
            429,
            _("This account has {n} requests being answered; send more when one has ended.").format(
                n=MAX_ANSWERING
            ),
            code="rate_limit_exceeded",
            retry_after=QUEUE_RETRY_SECONDS,
        )
    _answering[account_id] += 1
    request[_SLOT] = account_id


def _one_of_few(
    handler: Callable[[web.Request], Awaitable[web.Response]],
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """`handler`, giving back the answer slot `_enter` took, however it ends."""

    @functools.wraps(handler)
    async def bounded(request: web.Request) -> web.Response:
        try:
            return await handler(request)
        finally:
            account_id = request.get(_SLOT)
            if account_id is not None:
                _answering[account_id] -= 1
                if _answering[account_id] <= 0:
                    del _answering[account_id]

    return bounded


def unknown_model(name: object) -> ApiError:
    return ApiError(
        404,
        _("There is no model {name} for this key; GET /v1/models lists them.").format(
            name=str(name)[:80]
        ),
        param="model",
        code="model_not_found",
    )


def job_uuid(text: str) -> uuid.UUID:
    return uuid.UUID(text)


@_one_of_few
async def generations(request: web.Request) -> web.Response:
    svc, who = await caller(request)
    _enter(request)
    await _limits_first(request, svc, who)
    if request.content_length is not None and request.content_length > MAX_JSON:
        raise ApiError(413, _("That upload is too large."))
    raw = await _read_body(request, MAX_JSON)  # a chunked body has no Content-Length
    if raw is None:
        raise ApiError(413, _("That upload is too large."))
    try:
        body = json.loads(raw)
    except ValueError:
        raise bad_request(_("The request's body is not JSON.")) from None
    if not isinstance(body, dict):
        raise bad_request(_("The request's body is not JSON."))
    prompt = body.get("prompt")
    ask = Ask(
        model=body.get("model") if isinstance(body.get("model"), str) else "",
        prompt=prompt if isinstance(prompt, str) else None,
        n=body.get("n", 1),
        size=body.get("size"),
        response_format=body.get("response_format"),
    )
    if ask.prompt is None:
        raise bad_request(_("Give a prompt."), param="prompt")
    return await _answer(request, svc, who, ask, edit=False)


@_one_of_few
async def edits(request: web.Request) -> web.Response:
    svc, who = await caller(request)
    _enter(request)
    await _limits_first(request, svc, who)
    try:
        reader = await request.multipart()
    except (AssertionError, ValueError, KeyError):
        raise bad_request(_("Send the edit as multipart/form-data.")) from None
    ask = Ask()
    limits = svc.settings.limits
    for _i in range(MAX_PARTS + 1):
        part = await reader.next()
        if part is None:
            break
        if not isinstance(part, BodyPartReader):
            raise bad_request(_("Send the edit as multipart/form-data."))
        name = (part.name or "").removesuffix("[]")
        if name in ("image", "mask"):
            data = await _read(part, limits.max_image_bytes)
            if data is None:
                raise ApiError(413, _("That upload is too large."), param=name)
            if name == "mask":
                ask.mask = True
                continue
            if len(ask.images) >= MAX_IMAGES:
                raise bad_request(_("That request has too many parts."), param="image")
            try:
                checked = await asyncio.to_thread(
                    images.check_image,
                    data,
                    max_bytes=limits.max_image_bytes,
                    max_pixels=limits.max_image_pixels,
                )
            except errors.UsageError as exc:
                raise from_usage(exc) from None
            ask.images.append(
                jobs.InputImage(
                    filename=f"api.{MIMES[checked.mime]}", mime=checked.mime, data=checked.data
                )
            )
            continue
        raw = await _read(part, MAX_FIELD)
        if raw is None:
            raise ApiError(413, _("That upload is too large."), param=name)
        text = raw.decode("utf-8", "replace")
        if name == "model":
            ask.model = text
        elif name == "prompt":
            ask.prompt = text
        elif name in ("n", "size", "response_format"):
            setattr(ask, name, text)
    else:
        raise bad_request(_("That request has too many parts."))
    if ask.prompt is None:
        raise bad_request(_("Give a prompt."), param="prompt")
    return await _answer(request, svc, who, ask, edit=True)


async def _limits_first(request: web.Request, svc: ApiServices, who: access_mod.Who) -> None:
    """The desk's limits, asked before the body is read or an image decoded (as the chat
    and the pages do); a retry of a request whose jobs were queued passes, since the
    store answers it with those jobs whatever the limits say now."""
    try:
        await submit.check_limits(svc, who)
    except errors.UsageError as exc:
        sent = request.headers.get("Idempotency-Key", "")
        if not (
            who.allowed
            and IDEMPOTENCY.match(sent)
            and await svc.db.jobs.key_used(_job_key(request, sent, 0), who.user_id)
        ):
            raise from_usage(exc) from None


def _job_key(request: web.Request, token: str, i: int) -> str:
    return f"api:{request[ACCOUNT].id}:{token}:{i}"


async def _read_body(request: web.Request, limit: int) -> bytes | None:
    """The request's body, or None past `limit` bytes (read no further)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(64 * 1024):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def _read(part: BodyPartReader, limit: int) -> bytes | None:
    """The part's body, or None past `limit` bytes (read no further)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await part.read_chunk(64 * 1024):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _count(value: Any) -> int:
    try:
        n = int(value) if not isinstance(value, bool) else -1
    except (TypeError, ValueError):
        n = -1
    if isinstance(value, float) and not value.is_integer():
        n = -1
    if not 1 <= n <= MAX_N:
        raise bad_request(_("n is the number of images, from 1 to {n}.").format(n=MAX_N), param="n")
    return n


def _size(entry: registry.Entry, value: Any) -> dict[str, object]:
    """The workflow's width and height for `size` ("WxH"); none when it has no such
    options or the client leaves the size to us."""
    if value is None or value == "" or value == "auto":
        return {}
    found = SIZE.match(value) if isinstance(value, str) else None
    if found is None:
        raise bad_request(
            _("size is the image's width and height in pixels, such as 1024x1024."),
            param="size",
        )
    params = entry.workflow.params
    if "width" not in params or "height" not in params:
        return {}
    return {"width": int(found.group(1)), "height": int(found.group(2))}


async def _answer(
    request: web.Request, svc: ApiServices, who: access_mod.Who, ask: Ask, *, edit: bool
) -> web.Response:
    entry = await svc.registry.get(ask.model) if ask.model else None
    if entry is None or not entry.allows(who):
        raise unknown_model(ask.model)
    n = _count(ask.n)
    response_format = ask.response_format or "b64_json"
    if response_format not in FORMATS:
        raise bad_request(_("response_format is b64_json or url."), param="response_format")
    wf = entry.workflow
    wanted = len(wf.image_params)
    if ask.mask:
        raise bad_request(
            _("The model {name} takes no mask; describe the change in the prompt.").format(
                name=entry.name
            ),
            param="mask",
        )
    if edit and not wanted:
        raise bad_request(
            _("The model {name} takes no image; use /v1/images/generations.").format(
                name=entry.name
            ),
            param="image",
        )
    if not edit and wanted:
        raise bad_request(
            _("The model {name} edits an image; use /v1/images/edits.").format(name=entry.name),
            param="model",
        )
    if edit and len(ask.images) != wanted:
        raise bad_request(
            _("The model {name} takes {n} image(s); {given} were sent.").format(
                name=entry.name, n=wanted, given=len(ask.images)
            ),
            param="image",
        )
    if wf.prompt_param is None:
        raise bad_request(
            _("The model {name} takes no prompt.").format(name=entry.name), param="prompt"
        )
    why = availability.reason(svc.pool, wf)
    if why is not None:
        raise ApiError(503, availability.refusal(entry, why), type="server_error", code="no_gpu")
    values: dict[str, object] = {wf.prompt_param: ask.prompt, **_size(entry, ask.size)}
    for name in wf.image_params:
        values[name] = submit.IMAGE_PLACEHOLDER
    try:
        # A bad size or prompt is answered before anything is queued; the limits, asked
        # before the body was read, are asked again by the store with each job.
        submit.validate(svc.settings, wf, values)
        await submit.check_policy(svc, entry.name, submit.policy_texts(wf, values))
    except policy_mod.PromptRefused as exc:
        raise ApiError(400, _(str(exc)), param="prompt", code="content_policy_violation") from None
    except errors.UsageError as exc:
        problem = from_usage(exc)
        if problem.param in ("width", "height"):
            problem.param = "size"
        raise problem from None
    mark = svc.waiter.mark()  # before queueing: the news of each job is heard from here
    queued = await _queue(request, svc, who, entry, values, ask.images, n)
    created = int(time.time())
    data: list[dict[str, Any]] = []
    for job in queued:
        since = mark if job.status is jobs.Status.QUEUED else None
        data += await _results(svc, job.id, response_format, _base(request, svc), since)
    return web.json_response({"created": created, "data": data})


async def _queue(
    request: web.Request,
    svc: ApiServices,
    who: access_mod.Who,
    entry: registry.Entry,
    values: dict[str, object],
    inputs: list[jobs.InputImage],
    n: int,
) -> list[jobs.Job]:
    """Queue n jobs (n seeds); a refusal part-way cancels those queued by this request.
    A client's Idempotency-Key makes a retried request wait for the same jobs."""
    sent = request.headers.get("Idempotency-Key", "")
    token = sent if IDEMPOTENCY.match(sent) else uuid.uuid4().hex
    queued: list[jobs.Job] = []
    try:
        for i in range(n):
            job = await submit.queue(
                svc, who, entry, dict(values), inputs, key=_job_key(request, token, i)
            )
            queued.append(job)
    except errors.UsageError as exc:
        for job in queued:
            await svc.db.jobs.cancel(job.id, by_user=who.user_id)
        raise from_usage(exc) from None
    return queued


def _base(request: web.Request, svc: ApiServices) -> str:
    public = svc.settings.web.public_url
    return public.rstrip("/") if public else str(request.url.origin())


async def _results(
    svc: ApiServices, job_id: uuid.UUID, response_format: str, base: str, since: int | None
) -> list[dict[str, Any]]:
    status, job = await svc.waiter.finished(job_id, queued_at=since)
    if status is None or status is jobs.Status.CANCELLED:
        raise ApiError(
            500,
            _("The job was cancelled or deleted before it finished."),
            type="server_error",
            code="cancelled",
        )
    if status is not jobs.Status.SUCCEEDED:
        error = job.error if job is not None else None
        raise ApiError(500, failures.sentence(error), type="server_error", code="job_failed")
    outputs = [o for o in await svc.db.jobs.outputs(job_id) if o.mime in MIMES]
    if response_format == "url":
        return [{"url": base + links.path(svc.link_secret, job_id, o.index)} for o in outputs]
    return [{"b64_json": base64.b64encode(o.data).decode("ascii")} for o in outputs]
