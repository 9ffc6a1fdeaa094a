"""``POST /v1/images/generations`` and ``/v1/images/edits``: the request read as OpenAI's
SDK sends it, turned into the values of a command's workflow, queued through the desk
(its limits and content policy, as the chat and the pages), and answered once every job
has finished. The prompt and images are never logged."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import re
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import BodyPartReader, web

from comfyveil import errors
from comfyveil import policy as policy_mod
from comfyveil.api import formats, job_events, links, retries, streaming, webhooks
from comfyveil.api.context import ACCOUNT, ApiServices, caller, services
from comfyveil.api.errors import QUEUE_RETRY_SECONDS, ApiError, bad_request, from_usage
from comfyveil.api.uploads import input_image, read_part
from comfyveil.desk import access as access_mod
from comfyveil.desk import availability, failures, registry, submit
from comfyveil.i18n import _
from comfyveil.images import MIMES
from comfyveil.store import api_requests, jobs

MAX_N = 10  # OpenAI's own bound on n
logger = logging.getLogger(__name__)

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
    output_format: Any = None
    output_compression: Any = None
    stream: Any = False
    quality: Any = None
    background: Any = None
    partial_images: Any = None
    images: list[jobs.InputImage] = field(default_factory=list)
    mask: bool = False
    # a digest of the whole request, for a retry to find the jobs of its first try
    fingerprint: retries.Fingerprint | None = None

    def take(self, name: str, value: Any) -> None:
        """A field of the request: the ones that change the answer are kept; `style`,
        `moderation`, `user`, `safety_identifier` and any other are
        accepted and left aside (documented), never stored."""
        if name == "model":
            self.model = value if isinstance(value, str) else ""
        elif name == "prompt":
            self.prompt = value if isinstance(value, str) else None
        elif name in KEPT:
            setattr(self, name, value)


KEPT = (
    "n",
    "size",
    "response_format",
    "output_format",
    "output_compression",
    "stream",
    "quality",
    "background",
    "partial_images",
)


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
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """`handler`, giving back the answer slot `_enter` took, however it ends."""

    @functools.wraps(handler)
    async def bounded(request: web.Request) -> web.StreamResponse:
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
    if not isinstance(name, str) or not name.strip():
        return ApiError(
            400,
            _("Name a model: GET /v1/models lists the ones this key may use."),
            param="model",
            code="model_not_found",
        )
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


def _fingerprint(request: web.Request, route: str) -> retries.Fingerprint | None:
    """None for a request with its own Idempotency-Key (the key says what a retry is)."""
    if IDEMPOTENCY.match(request.headers.get("Idempotency-Key", "")):
        return None
    return retries.Fingerprint(route, request[ACCOUNT].id, services(request).link_secret)


async def _limits_first(request: web.Request, svc: ApiServices, who: access_mod.Who) -> None:
    """The desk's limits, asked before the body is read or an image decoded (as the chat
    and the pages do); a retry of a request whose jobs were queued passes, since the
    store answers it with those jobs whatever the limits say now: one with the same
    Idempotency-Key, or, while the account has requests whose client went away, one
    that may take those over (told apart by its body, read next)."""
    try:
        await submit.check_limits(svc, who)
    except errors.UsageError as exc:
        sent = request.headers.get("Idempotency-Key", "")
        if not (
            who.allowed
            and IDEMPOTENCY.match(sent)
            and await svc.db.jobs.key_used(_job_key(request, sent, 0), who.user_id)
        ) and not (
            who.allowed and not sent and await svc.requests.has_abandoned(request[ACCOUNT].id)
        ):
            raise from_usage(exc) from None


def _job_key(request: web.Request, token: str, i: int) -> str:
    return f"api:{request[ACCOUNT].id}:{token}:{i}"


async def _json_body(request: web.Request, limit: int) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, _("That upload is too large."))
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(64 * 1024):  # a read may return less
        size += len(chunk)
        if size > limit:
            raise ApiError(413, _("That upload is too large."))
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, RecursionError):  # "[[[[..." nested past Python's stack
        raise bad_request(_("The request's body is not JSON.")) from None
    if not isinstance(body, dict):
        raise bad_request(_("The request's body is not JSON."))
    return body


def _from_json(body: dict[str, Any], fingerprint: retries.Fingerprint | None) -> Ask:
    ask = Ask(fingerprint=fingerprint)
    for name, value in body.items():
        ask.take(name, value)
    if fingerprint is not None:
        fingerprint.add("json", json.dumps(body, sort_keys=True).encode())
    return ask


@_one_of_few
async def generations(request: web.Request) -> web.StreamResponse:
    svc, who = await caller(request)
    _enter(request)
    await _limits_first(request, svc, who)
    body = await _json_body(request, MAX_JSON)
    ask = _from_json(body, _fingerprint(request, "generations"))
    if ask.prompt is None:
        raise bad_request(_("Give a prompt."), param="prompt")
    return await _answer(request, svc, who, ask, edit=False)


@_one_of_few
async def edits(request: web.Request) -> web.StreamResponse:
    svc, who = await caller(request)
    _enter(request)
    await _limits_first(request, svc, who)
    limits = svc.settings.limits
    if request.content_type == "application/json":
        # the JSON form: images as data URLs ("image", "image[]" or "images":
        # [{"image_url": ...}]), as OpenAI's newer clients send them
        body = await _json_body(request, MAX_JSON + MAX_IMAGES * limits.max_image_bytes * 4 // 3)
        ask = _from_json(body, _fingerprint(request, "edits"))
        for name in ("image", "image[]", "images"):
            for item in _listed(body.get(name)):
                url = item.get("image_url") if isinstance(item, dict) else item
                await _add_image(ask, _data_url(url), svc)
        if body.get("mask") is not None:
            ask.mask = True
    else:
        ask = await _from_multipart(request, svc)
    if ask.prompt is None:
        raise bad_request(_("Give a prompt."), param="prompt")
    return await _answer(request, svc, who, ask, edit=True)


def _listed(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _data_url(value: Any) -> bytes:
    """The bytes of a ``data:image/...;base64,`` URL (a web address is not fetched: the
    server never reaches out to where a client points it)."""
    text = value if isinstance(value, str) else ""
    head, comma, payload = text.partition(",")
    if not comma or not head.startswith("data:") or not head.endswith(";base64"):
        raise bad_request(_("Send each image as a file or as a data: URL."), param="image")
    try:
        return base64.b64decode(payload, validate=True)
    except ValueError:
        raise bad_request(
            _("Send each image as a file or as a data: URL."), param="image"
        ) from None


async def _add_image(ask: Ask, data: bytes, svc: ApiServices) -> None:
    if len(ask.images) >= MAX_IMAGES:
        raise bad_request(_("That request has too many parts."), param="image")
    image = await input_image(data, svc.settings.limits)
    if ask.fingerprint is not None:
        ask.fingerprint.add("image", data)
    ask.images.append(image)


async def _from_multipart(request: web.Request, svc: ApiServices) -> Ask:
    try:
        reader = await request.multipart()
    except (AssertionError, ValueError, KeyError):
        raise bad_request(_("Send the edit as multipart/form-data.")) from None
    ask = Ask(fingerprint=_fingerprint(request, "edits"))
    limits = svc.settings.limits
    for _i in range(MAX_PARTS + 1):
        part = await reader.next()
        if part is None:
            break
        if not isinstance(part, BodyPartReader):
            raise bad_request(_("Send the edit as multipart/form-data."))
        name = (part.name or "").removesuffix("[]")
        if name in ("image", "mask"):
            data = await read_part(part, limits.max_image_bytes, param=name)
            if name == "mask":
                ask.mask = True
                continue
            await _add_image(ask, data, svc)
            continue
        raw = await read_part(part, MAX_FIELD, param=name)
        if ask.fingerprint is not None:
            ask.fingerprint.add(name, raw)
        text = raw.decode("utf-8", "replace")
        ask.take(name, text)
    else:
        raise bad_request(_("That request has too many parts."))
    return ask


def _count(value: Any) -> int:
    try:
        n = int(value) if not isinstance(value, bool) else -1
    except (TypeError, ValueError, OverflowError):  # 1e400 is JSON's infinity
        n = -1
    if isinstance(value, float) and not value.is_integer():
        n = -1
    if not 1 <= n <= MAX_N:
        raise bad_request(
            _("The number of images (n) is from 1 to {n}.").format(n=MAX_N), param="n"
        )
    return n


def _size(entry: registry.Entry, value: Any) -> dict[str, object]:
    """The workflow's width and height for `size` ("WxH"); none when it has no such
    options or the client leaves the size to us."""
    if value is None or value == "" or value == "auto":
        return {}
    found = SIZE.match(value) if isinstance(value, str) else None
    if found is None:
        raise bad_request(
            _("The size is the image's width and height in pixels, such as 1024x1024."),
            param="size",
        )
    params = entry.workflow.params
    if "width" not in params or "height" not in params:
        return {}
    return {"width": int(found.group(1)), "height": int(found.group(2))}


def _flag(value: Any) -> bool:
    """`stream` as JSON (true) or a form field ("true")."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return value is True


@dataclass(frozen=True)
class Shape:
    """How the results are answered."""

    response_format: str  # b64_json or url
    output_format: str | None  # png, jpeg, webp; None: as the workflow saved it
    compression: int | None
    stream: bool
    quality: str
    background: str
    partials: int  # sampler previews to stream before each image (OpenAI's 0-3)


def _shape(ask: Ask) -> Shape:
    response_format = ask.response_format or "b64_json"
    if response_format not in FORMATS:
        raise bad_request(_("The response_format is b64_json or url."), param="response_format")
    output_format = ask.output_format or None
    if output_format is not None:
        output_format = str(output_format).strip().lower()
        if output_format not in formats.FORMATS:
            raise bad_request(_("The output_format is png, jpeg or webp."), param="output_format")
    compression = ask.output_compression
    if compression is not None and compression != "":
        try:
            compression = int(compression) if not isinstance(compression, bool) else -1
        except (TypeError, ValueError):
            compression = -1
        if not 0 <= compression <= 100:
            raise bad_request(
                _("The output_compression is a whole number from 0 to 100."),
                param="output_compression",
            )
    else:
        compression = None
    quality = ask.quality if ask.quality in QUALITIES else "auto"
    # no workflow draws a transparent background: the answer says "opaque", as it is
    background = "opaque" if ask.background in ("transparent", "opaque") else "auto"
    stream = _flag(ask.stream)
    try:
        partials = min(max(int(ask.partial_images or 0), 0), MAX_PARTIALS) if stream else 0
    except (TypeError, ValueError):
        partials = 0
    return Shape(response_format, output_format, compression, stream, quality, background, partials)


MAX_PARTIALS = 3  # OpenAI's bound on partial_images
QUALITIES = ("low", "medium", "high", "xhigh", "max", "auto")


def _prompt_limit(svc: ApiServices, entry: registry.Entry, prompt: str) -> None:
    """The desk's limit on a prompt's length, in the chat's words."""
    try:
        submit.check_prompt_length(svc.settings, entry.workflow, prompt)
    except errors.UsageError as exc:
        raise bad_request(str(exc), param="prompt") from None


async def _answer(
    request: web.Request, svc: ApiServices, who: access_mod.Who, ask: Ask, *, edit: bool
) -> web.StreamResponse:
    entry = await svc.registry.get(ask.model) if ask.model else None
    if entry is None or not entry.allows(who):
        raise unknown_model(ask.model)
    n = _count(ask.n)
    shape = _shape(ask)
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
    # A model without a prompt (an upscaler) takes the prompt every client sends, unread.
    values: dict[str, object] = {**_size(entry, ask.size)}
    if wf.prompt_param is not None:
        _prompt_limit(svc, entry, ask.prompt or "")
        values[wf.prompt_param] = ask.prompt
    for name in wf.image_params:
        values[name] = submit.IMAGE_PLACEHOLDER
    account = request[ACCOUNT]
    fingerprint = ask.fingerprint.digest() if ask.fingerprint is not None else None
    # A retry of a request whose client went away takes its jobs over (before the checks
    # below: they passed for those jobs, and a GPU down now does not undo them).
    taken = await _take_over(svc, account.id, fingerprint)
    row: asyncio.Future[int] | None = None  # the request's row, written beside the wait
    if taken is not None:
        row = asyncio.get_running_loop().create_future()
        row.set_result(taken.id)
        job_ids = list(taken.job_ids)
        mark: int | None = None
    else:
        why = availability.reason(svc.pool, wf)
        if why is not None and svc.pool is not None:
            await svc.pool.refresh_models()  # a model installed since the last read counts
            why = availability.reason(svc.pool, wf)
        if why is not None:
            raise ApiError(
                503, availability.refusal(entry, why), type="server_error", code="no_gpu"
            )
        try:
            # A bad size or prompt is answered before anything is queued; the limits are
            # asked by the store with each job (`submit.queue`), not once more before.
            submit.validate(svc.settings, wf, values)
            await submit.check_policy(svc, entry.name, submit.policy_texts(wf, values))
        except policy_mod.PromptRefused as exc:
            raise ApiError(
                400, _(str(exc)), param="prompt", code="content_policy_violation"
            ) from None
        except errors.UsageError as exc:
            problem = from_usage(exc)
            if problem.param in ("width", "height"):
                problem.param = "size"
            raise problem from None
        mark = svc.waiter.mark()  # before queueing: the news of each job is heard from here
        queued = await _queue(request, svc, who, entry, values, ask.images, n)
        job_ids = [job.id for job in queued]
        if any(job.status is not jobs.Status.QUEUED for job in queued):
            mark = None  # an Idempotency-Key's jobs from before: read them
        if fingerprint is not None:
            row = asyncio.ensure_future(
                retries.through_outage(lambda: svc.requests.open(account.id, fingerprint, job_ids))
            )
    visit = (
        None if row is None or fingerprint is None else svc.visits.enter(fingerprint, request, row)
    )
    answer = streaming.Answer(request, shape, edit=edit)
    closing = request.app.get(job_events.CLOSING)  # set when this process shuts down
    handed = False
    erred = False  # an error is about to be answered (a 5xx the SDK retries at once)
    try:
        work = _results(svc, job_ids, shape, _base(request, svc), mark)
        if shape.stream:
            await answer.open()
            if shape.partials:
                await answer.follow(svc.previews, job_ids)
        try:
            present, data = await retries.unless_gone(
                request, work, tick=answer.ping if shape.stream else None, stop=closing
            )
        except ApiError as problem:
            handed = True  # the client hears it: the request is over
            if shape.stream:
                return await answer.error(problem)
            raise
        if not present or data is None:
            if closing is None or not closing.is_set() or not retries.connected(request):
                return web.Response(status=499)  # nobody is there to read it
            # This process is stopping (a restart): the client is told to try again, and
            # its retry, on whichever process serves it, takes these jobs over. The leave
            # is noted before it is told, so the retry finds it; the shutdown need not
            # wait for the jobs.
            if visit is not None:
                await asyncio.wait({svc.visits.end(visit, handed=False)})
            stopping = ApiError(
                503,
                _("Something went wrong on the server; try again."),
                type="server_error",
                code="server_stopping",
            )
            if shape.stream:
                return await answer.error(stopping)
            raise stopping
        # Handed only once the whole answer is written: a client that leaves while it
        # is being written never had it, and its retry must find the jobs, not pay again.
        try:
            if shape.stream:
                response = await answer.completed(data)
            else:
                response = web.json_response({"created": int(time.time()), "data": data})
                await response.prepare(request)
                await response.write_eof()
        except ConnectionError:
            return web.Response(status=499)
        handed = True
        return response
    except Exception:
        erred = True
        raise
    finally:
        # The leave is noted before anything else is awaited here: a cancellation (a
        # shutdown) landing in the previews' stop must not leave the row waited for.
        if visit is not None:  # after the answer, off its path (and even if cancelled)
            leaving = svc.visits.end(visit, handed=handed)
            if erred and not handed:
                # An error (a 5xx) is about to be answered, and the client's SDK retries
                # it at once: the leave is on record first, so the retry, on whichever
                # process, takes these jobs over instead of paying anew.
                await asyncio.wait({leaving}, timeout=retries.LEAVE_WAIT)
        if not handed and job_ids:  # its client went away: its jobs' ends go to the webhooks
            told = asyncio.create_task(_client_went_away(svc, job_ids), name="api-webhooks")
            svc.leaving.add(told)
            told.add_done_callback(svc.leaving.discard)
        await answer.stop()  # the previews, whatever the answer became


async def _take_over(
    svc: ApiServices, account_id: int, fingerprint: bytes | None
) -> api_requests.Taken | None:
    """The row of an identical request whose client went away, made this request's: one
    already left, or one this process still answers whose client is gone (a retry sent
    before its first try noticed)."""
    if fingerprint is None:
        return None
    taken = await svc.requests.take_over(account_id, fingerprint)
    if taken is None and await svc.visits.let_go_of_gone(fingerprint):
        taken = await svc.requests.take_over(account_id, fingerprint)
    return taken


async def _client_went_away(svc: ApiServices, job_ids: list[uuid.UUID]) -> None:
    try:
        for job_id in job_ids:
            await webhooks.client_went_away(svc.db, job_id)
    except Exception as exc:  # the result still waits for a retry; only the event is lost
        logger.warning(
            "could not watch an abandoned request's jobs for webhooks: %s",
            type(exc).__name__,
            extra={"action": "api_webhook_watch_failed"},
        )


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
    svc: ApiServices, job_ids: list[uuid.UUID], shape: Shape, base: str, since: int | None
) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = []
    for job_id in job_ids:
        # The database blinking (a restart, a crash recovery) does not fail a request
        # whose jobs are queued: its jobs go on, and so does the wait for them.
        data += await retries.through_outage(
            functools.partial(_result, svc, job_id, shape, base, since)
        )
    return data


async def _result(
    svc: ApiServices, job_id: uuid.UUID, shape: Shape, base: str, since: int | None
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
    if shape.response_format == "url":
        return [
            {
                "url": base
                + links.path(svc.link_secret, job_id, o.index, fmt=shape.output_format or "")
            }
            for o in outputs
        ]
    found: list[dict[str, Any]] = []
    for o in outputs:
        data = o.data
        if shape.output_format is not None or shape.compression is not None:
            wanted = shape.output_format or formats.MIME_FORMATS.get(o.mime, "png")
            data = await asyncio.to_thread(formats.convert, data, o.mime, wanted, shape.compression)
        found.append({"b64_json": base64.b64encode(data).decode("ascii")})
    return found
