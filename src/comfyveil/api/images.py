"""``POST /v1/images/generations`` and ``/v1/images/edits``: the request (read and
checked by image_request.py) turned into the values of a command's workflow, queued
through the desk (its limits and content policy, as the chat and the pages), and answered
once every job has finished, through a database blink and a client's retry. The prompt
and images are never logged."""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
import time
import uuid
from typing import Any

from aiohttp import web

from comfyveil import errors
from comfyveil import policy as policy_mod
from comfyveil.api import (
    answer_slots,
    formats,
    image_request,
    job_events,
    links,
    retries,
    streaming,
    webhooks,
)
from comfyveil.api.context import ACCOUNT, ApiServices, caller
from comfyveil.api.errors import ApiError, bad_request, from_usage
from comfyveil.desk import access as access_mod
from comfyveil.desk import availability, failures, registry, submit
from comfyveil.i18n import _
from comfyveil.images import MIMES
from comfyveil.store import api_requests, jobs

logger = logging.getLogger(__name__)


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
            and image_request.IDEMPOTENCY.match(sent)
            and await svc.db.jobs.key_used(_job_key(request, sent, 0), who.user_id)
        ) and not (
            who.allowed and not sent and await svc.requests.has_abandoned(request[ACCOUNT].id)
        ):
            raise from_usage(exc) from None


def _job_key(request: web.Request, token: str, i: int) -> str:
    return f"api:{request[ACCOUNT].id}:{token}:{i}"


@answer_slots.one_of_few
async def generations(request: web.Request) -> web.StreamResponse:
    svc, who = await caller(request)
    answer_slots.enter(request)
    await _limits_first(request, svc, who)
    ask = await image_request.read_generation(request)
    if ask.prompt is None:
        raise bad_request(_("Give a prompt."), param="prompt")
    return await _answer(request, svc, who, ask, edit=False)


@answer_slots.one_of_few
async def edits(request: web.Request) -> web.StreamResponse:
    svc, who = await caller(request)
    answer_slots.enter(request)
    await _limits_first(request, svc, who)
    ask = await image_request.read_edit(request, svc)
    if ask.prompt is None:
        raise bad_request(_("Give a prompt."), param="prompt")
    return await _answer(request, svc, who, ask, edit=True)


def _prompt_limit(svc: ApiServices, entry: registry.Entry, prompt: str) -> None:
    """The desk's limit on a prompt's length, in the chat's words."""
    try:
        submit.check_prompt_length(svc.settings, entry.workflow, prompt)
    except errors.UsageError as exc:
        raise bad_request(str(exc), param="prompt") from None


async def _answer(
    request: web.Request,
    svc: ApiServices,
    who: access_mod.Who,
    ask: image_request.Ask,
    *,
    edit: bool,
) -> web.StreamResponse:
    entry = await svc.registry.get(ask.model) if ask.model else None
    if entry is None or not entry.allows(who):
        raise unknown_model(ask.model)
    n = image_request.count(ask.n)
    shape = image_request.shape(ask)
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
    values: dict[str, object] = {**image_request.size_values(entry, ask.size)}
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
    token = sent if image_request.IDEMPOTENCY.match(sent) else uuid.uuid4().hex
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
    svc: ApiServices,
    job_ids: list[uuid.UUID],
    shape: image_request.Shape,
    base: str,
    since: int | None,
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
    svc: ApiServices, job_id: uuid.UUID, shape: image_request.Shape, base: str, since: int | None
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
