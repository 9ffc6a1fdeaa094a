"""The jobs API: any command, image or video, queued at once and followed at leisure, for
work longer than a client holds a connection (the images API answers only at the end).

``POST /v1/jobs`` queues through the desk (the same access rule, content policy, limits,
option names, bounds and sentences as the chat and the web form) and answers 202 with the
job; ``GET /v1/jobs/{id}`` tells it, ``GET /v1/jobs`` lists the account's a page at a
time, ``GET /v1/jobs/{id}/outputs/{index}`` hands a result over, ``DELETE`` cancels or
forgets. The event stream is in `job_events`. Prompts and images are never logged."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import re
import uuid
from collections.abc import Mapping

from aiohttp import BodyPartReader, web

from comfyveil import errors, images, sinks
from comfyveil import policy as policy_mod
from comfyveil.api import job_view
from comfyveil.api.context import ACCOUNT, ApiServices, caller
from comfyveil.api.errors import ApiError, bad_request, from_usage
from comfyveil.api.uploads import input_image, read_part
from comfyveil.comfy.params import ParamError
from comfyveil.desk import access as access_mod
from comfyveil.desk import availability, options, registry, submit
from comfyveil.i18n import _
from comfyveil.store import api_jobs, jobs

MAX_FIELDS = 64 * 1024  # the command, prompt and options of one request
MAX_PARTS = 16  # fields and images of one multipart request
MAX_IMAGES = 4  # no shipped command takes more than one
PAGE = 20  # jobs per page of the list, unless the client asks
MAX_PAGE = 100
IDEMPOTENCY = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
DATA_URL = re.compile(r"^data:(image/[a-z0-9.+-]+)?(;[^,]*)?,", re.IGNORECASE)
IMAGE_FIELDS = ("image", "images")


def _store(svc: ApiServices) -> api_jobs.ApiJobStore:
    return api_jobs.ApiJobStore(svc.db.pool)


def no_job(text: str) -> ApiError:
    return ApiError(
        404,
        _("There is no job {id} for this key.").format(id=text[:40]),
        code="job_not_found",
    )


def job_uuid(request: web.Request) -> uuid.UUID:
    text = request.match_info["job"]
    try:
        return uuid.UUID(text)
    except ValueError:
        raise no_job(text) from None


async def owned(request: web.Request) -> tuple[ApiServices, access_mod.Who, jobs.Job]:
    """The caller's job named in the path (404 for anyone else's: the same answer as for
    a job that does not exist)."""
    svc, who = await caller(request)
    job_id = job_uuid(request)
    job = await svc.db.jobs.get(job_id)
    if job is None or job.user_id != request[ACCOUNT].user_id:
        raise no_job(str(job_id))
    return svc, who, job


# --- reading a request ------------------------------------------------------------------


class Ask:
    """One POST /v1/jobs, read."""

    def __init__(self) -> None:
        self.command: object = None
        self.prompt: object = None
        self.options: object = None
        self.images: list[bytes] = []


def _image_limit(svc: ApiServices) -> int:
    return svc.settings.limits.max_image_bytes


async def _read_json(request: web.Request, svc: ApiServices) -> Ask:
    limit = MAX_FIELDS + MAX_IMAGES * (_image_limit(svc) * 4 // 3 + 128)
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, _("That upload is too large."))
    raw = await request.content.read(limit + 1)
    if len(raw) > limit:
        raise ApiError(413, _("That upload is too large."))
    try:
        body = json.loads(raw)
    except ValueError:
        raise bad_request(_("The request's body is not JSON.")) from None
    if not isinstance(body, dict):
        raise bad_request(_("The request's body is not JSON."))
    ask = Ask()
    ask.command, ask.prompt, ask.options = (
        body.get("command"),
        body.get("prompt"),
        body.get("options"),
    )
    given = body.get("images", [])
    if given is None:
        given = []
    if not isinstance(given, list):
        raise bad_request(
            _("images is a list of data URLs, such as data:image/png;base64,..."), param="images"
        )
    if len(given) > MAX_IMAGES:
        raise bad_request(_("That request has too many parts."), param="images")
    for item in given:
        ask.images.append(_from_data_url(item, _image_limit(svc)))
    return ask


def _from_data_url(item: object, limit: int) -> bytes:
    found = DATA_URL.match(item) if isinstance(item, str) else None
    if found is None or "base64" not in (found.group(2) or ""):
        raise bad_request(
            _("images is a list of data URLs, such as data:image/png;base64,..."),
            param="images",
        )
    encoded = item[found.end() :]  # type: ignore[index]
    if len(encoded) > limit * 4 // 3 + 8:
        raise ApiError(413, _("That upload is too large."), param="images")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(
            _("images is a list of data URLs, such as data:image/png;base64,..."),
            param="images",
        ) from None


async def _read_multipart(request: web.Request, svc: ApiServices) -> Ask:
    try:
        reader = await request.multipart()
    except (AssertionError, ValueError, KeyError):
        raise bad_request(_("Send the job as JSON or multipart/form-data.")) from None
    ask = Ask()
    for _i in range(MAX_PARTS + 1):
        part = await reader.next()
        if part is None:
            return ask
        if not isinstance(part, BodyPartReader):
            raise bad_request(_("Send the job as JSON or multipart/form-data."))
        name = (part.name or "").removesuffix("[]")
        if name in IMAGE_FIELDS:
            if len(ask.images) >= MAX_IMAGES:
                raise bad_request(_("That request has too many parts."), param="images")
            data = await read_part(part, _image_limit(svc), param="images")
            ask.images.append(data)
            continue
        raw = await read_part(part, MAX_FIELDS, param=name)
        text = raw.decode("utf-8", "replace")
        if name == "command":
            ask.command = text
        elif name == "prompt":
            ask.prompt = text
        elif name == "options":
            try:
                ask.options = json.loads(text)
            except ValueError:
                raise bad_request(
                    _("options is a JSON object of option names and values."),
                    param="options",
                ) from None
    raise bad_request(_("That request has too many parts."))


async def _checked_images(svc: ApiServices, given: list[bytes]) -> list[jobs.InputImage]:
    return [await input_image(data, svc.settings.limits, param="images") for data in given]


def unknown_command(name: object) -> ApiError:
    return ApiError(
        404,
        _("There is no command {name} for this key; GET /v1/models lists them.").format(
            name=str(name)[:80]
        ),
        param="command",
        code="command_not_found",
    )


def _values(entry: registry.Entry, ask: Ask) -> dict[str, object]:
    if ask.prompt is not None and not isinstance(ask.prompt, str):
        raise bad_request(_("prompt is text."), param="prompt")
    given = ask.options if ask.options is not None else {}
    if not isinstance(given, Mapping) or not all(isinstance(k, str) for k in given):
        raise bad_request(
            _("options is a JSON object of option names and values."),
            param="options",
        )
    try:
        return options.values_for(entry, ask.prompt, given)
    except (options.OptionError, ParamError) as exc:
        problem = from_usage(exc)
        problem.param = getattr(exc, "param", None) or "options"
        raise problem from None


# --- the routes -------------------------------------------------------------------------


async def create(request: web.Request) -> web.Response:
    svc, who = await caller(request)
    if request.content_type.startswith("multipart/"):
        ask = await _read_multipart(request, svc)
    else:
        ask = await _read_json(request, svc)
    if not isinstance(ask.command, str) or not ask.command:
        raise bad_request(_("Give a command, such as f or wan."), param="command")
    entry = await svc.registry.get(ask.command.lstrip("/"))
    if entry is None or not entry.allows(who):
        raise unknown_command(ask.command)
    values = _values(entry, ask)
    wanted = len(entry.workflow.image_params)
    if len(ask.images) != wanted:
        raise bad_request(
            _("The model {name} takes {n} image(s); {given} were sent.").format(
                name=entry.name, n=wanted, given=len(ask.images)
            ),
            param="images",
        )
    why = availability.reason(svc.pool, entry.workflow)
    if why is not None:
        raise ApiError(503, availability.refusal(entry, why), type="server_error", code="no_gpu")
    inputs = await _checked_images(svc, ask.images)
    sent = request.headers.get("Idempotency-Key", "")
    token = sent if IDEMPOTENCY.match(sent) else uuid.uuid4().hex
    try:
        job = await submit.queue(
            svc, who, entry, values, inputs, key=f"apijob:{request[ACCOUNT].id}:{token}"
        )
    except policy_mod.PromptRefused as exc:
        raise ApiError(400, _(str(exc)), param="prompt", code="content_policy_violation") from None
    except errors.UsageError as exc:
        problem = from_usage(exc)
        if problem.status == 400 and problem.param is None:
            problem.param = "options"
        raise problem from None
    # no place nor ETA here: GET /v1/jobs/{id} and the stream tell them
    response = web.json_response(await job_view.describe(svc, job, estimate=False), status=202)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return response


async def show(request: web.Request) -> web.Response:
    svc, _who, job = await owned(request)
    return web.json_response(await job_view.describe(svc, job))


def _cursor(job: jobs.Job) -> str:
    text = f"{job.created_at.isoformat()}|{job.id}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _after(text: str) -> tuple[dt.datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        at, _sep, job = raw.partition("|")
        when = dt.datetime.fromisoformat(at)
        if when.tzinfo is None:
            raise ValueError(at)
        return when, uuid.UUID(job)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise bad_request(
            _("after is the next_cursor of an earlier page."), param="after"
        ) from None


async def listing(request: web.Request) -> web.Response:
    svc, _who = await caller(request)
    raw_limit = request.query.get("limit", str(PAGE))
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_PAGE:
        raise bad_request(
            _("limit is the number of jobs a page holds, from 1 to {n}.").format(n=MAX_PAGE),
            param="limit",
        )
    limit = int(raw_limit)
    after = request.query.get("after")
    before = _after(after) if after else None
    found = await _store(svc).page(request[ACCOUNT].user_id, limit=limit + 1, before=before)
    more = len(found) > limit
    found = found[:limit]
    data = [await job_view.describe(svc, job) for job in found]
    return web.json_response(
        {
            "object": "list",
            "data": data,
            "has_more": more,
            "next_cursor": _cursor(found[-1]) if more and found else None,
        }
    )


async def output(request: web.Request) -> web.StreamResponse:
    svc, _who = await caller(request)
    job_id = job_uuid(request)
    text = request.match_info["index"]
    index = int(text) if text.isdigit() and len(text) < 6 else -1
    # one read: the owner, the state and the one file asked for
    found = await _store(svc).output(job_id, index, request[ACCOUNT].user_id)
    if found is None:  # which refusal: another account's job is one that does not exist
        job = await svc.db.jobs.get(job_id)
        if job is None or job.user_id != request[ACCOUNT].user_id:
            raise no_job(str(job_id))
        raise _no_output(text)
    # What its bytes say it is: a file named .png that is a page is a download, never a page.
    mime = images.sniff_mime(found.data) or "application/octet-stream"
    response = web.Response(body=found.data, content_type=mime)
    name = sinks.safe_name(found.filename)
    response.headers["Content-Disposition"] = f'attachment; filename="{name}"'
    response.headers["Cache-Control"] = "private, no-store"
    return response


def _no_output(text: str) -> ApiError:
    return ApiError(
        404, _("That job has no output {index}.").format(index=text[:10]), code="output_not_found"
    )


async def delete(request: web.Request) -> web.Response:
    """Cancel a job that is waiting or running (the worker withdraws its prompt from the
    GPU), or forget one that has finished (its files and history deleted)."""
    svc, who, job = await owned(request)
    if job.status.finished:
        await _store(svc).forget_finished(job.id, who.user_id)
        return web.json_response({"id": str(job.id), "object": "job.deleted", "deleted": True})
    now = await svc.db.jobs.cancel(job.id, by_user=who.user_id) or job
    return web.json_response(await job_view.describe(svc, now))
