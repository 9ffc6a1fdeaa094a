"""The command pages: the list of commands, one form each, and queueing a job from it.

Queueing goes through the store exactly as a chat command does (`JobStore.enqueue` with
the user's queue limit and daily quota, the same cooldown of `desk.access`), with a
one-time key in the form as the idempotency key: sending a form twice (reload, back)
never makes a second job.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from aiohttp import web

from comfyveil import errors, images
from comfyveil.desk import availability
from comfyveil.desk import registry as registry_mod
from comfyveil.desk.jobs import owned_output, parse_ref
from comfyveil.desk.submit import IMAGE_PLACEHOLDER, check_limits, queue
from comfyveil.i18n import _, ltr
from comfyveil.images import MIMES
from comfyveil.store import accounts as web_store
from comfyveil.store import jobs
from comfyveil.web import forms
from comfyveil.web.page import (
    WebServices,
    error_page,
    preferences,
    render,
    require_account,
    services,
    who_is,
)

logger = logging.getLogger(__name__)

RESULT_CHOICES = 30  # recent results offered as an edit's input
PROMPT_SHOWN = 40  # characters of a result's prompt in its name


async def home(request: web.Request) -> web.Response:
    svc = services(request)
    who = who_is(request)
    entries = [e for e in await svc.registry.all() if e.allows(who)]
    # The chat's rule: a command no GPU can run now is marked, not offered.
    runnable = {e.name for e in availability.runnable(svc.pool, entries)}
    # Each command's words looked up here, not by a template call per command.
    entries_shown = [(e.name, e.title(), e.description(), e.name in runnable) for e in entries]
    return render(
        request,
        "home.html",
        entries=entries_shown,
        unavailable_mark=_(availability.UNAVAILABLE_MARK),
        done=request.query.get("done"),
    )


async def result_choices(svc: WebServices, account: web_store.Account) -> list[tuple[str, str]]:
    """Recent results to edit, each named so that it differs from the others: the command
    and time to the second (left-to-right isolates in Persian and Arabic), which result
    of the job, the job's short id, and the start of its prompt."""
    items = await svc.web.gallery(account.user_id, limit=RESULT_CHOICES, offset=0)
    choices = []
    for i in items:
        if i.mime not in MIMES:
            continue
        label = _("{command} of {when}, result {n}").format(
            command=ltr(f"/{i.command}"), when=ltr(f"{i.created_at:%Y-%m-%d %H:%M:%S}"),
            n=ltr(i.index + 1))
        # Two jobs with one prompt in the same second read alike without their ids (the
        # short id the history and the chat show).
        label += " · " + ltr(f"#{uuid.UUID(str(i.job_id)).hex[:8]}")
        prompt = " ".join(i.prompt.split())
        if prompt:
            label += ": " + (
                prompt if len(prompt) <= PROMPT_SHOWN else prompt[: PROMPT_SHOWN - 1].rstrip() + "…"
            )
        choices.append((f"{i.job_id}:{i.index}", label))
    return choices


async def _entry(request: web.Request) -> registry_mod.Entry:
    svc = services(request)
    entry = await svc.registry.get(request.match_info["command"])
    # A command for admins only does not exist for anyone else: the same 404 as an unknown
    # one, so its form (title, options, bounds) is never shown to them.
    if entry is None or not entry.allows(who_is(request)):
        raise web.HTTPNotFound()
    return entry


async def form_page(request: web.Request) -> web.Response:
    account = require_account(request)
    svc = services(request)
    entry = await _entry(request)
    prefs = preferences(request)
    given: dict[str, str] = {}
    chosen = request.query.get("from", "")
    for name in entry.workflow.image_params:
        given[name + forms.FROM_SUFFIX] = chosen
    fields = forms.build_fields(
        entry,
        prefs,
        given=given if chosen else None,
        results=await result_choices(svc, account) if entry.takes_image else None,
        max_text=svc.settings.limits.max_prompt_length,
    )
    why = availability.reason(svc.pool, entry.workflow)  # said before the form is filled
    return render(
        request,
        "form.html",
        entry=entry,
        fields=fields,
        nonce=uuid.uuid4().hex,
        problem=availability.refusal(entry, why) if why is not None else None,
    )


async def _input_image(
    svc: WebServices, account: web_store.Account, name: str, form: Any
) -> jobs.InputImage:
    """The image for parameter `name`: the uploaded file, else the chosen result.

    Raises:
        ImageRejected, UsageError: a sentence for the field.
    """
    upload = form.get(name)
    limits = svc.settings.limits
    # An empty file input arrives as empty bytes without a name: no upload.
    if isinstance(upload, web.FileField) and upload.filename:
        data = upload.file.read(limits.max_image_bytes + 1)
        checked = await asyncio.to_thread(
            images.check_image,
            data,
            max_bytes=limits.max_image_bytes,
            max_pixels=limits.max_image_pixels,
        )
        return jobs.InputImage(
            filename=f"web.{MIMES[checked.mime]}", mime=checked.mime, data=checked.data
        )
    ref = form.get(name + forms.FROM_SUFFIX)
    if isinstance(ref, str) and ref:
        parsed = parse_ref(ref)
        output = await owned_output(svc, account, *parsed) if parsed else None
        if output is None or output.mime not in MIMES:
            raise errors.UsageError(_("That result is not available any more; choose another."))
        return jobs.InputImage(
            filename=f"result.{MIMES[output.mime]}", mime=output.mime, data=output.data
        )
    raise errors.UsageError(_("Upload an image or choose one of your results."))


async def submit(request: web.Request) -> web.Response:
    account = require_account(request)
    svc = services(request)
    entry = await _entry(request)
    try:
        form = await request.post()
    except web.HTTPRequestEntityTooLarge:
        return error_page(request, 413, _("That upload is too large."))
    values, field_errors = forms.read_values(entry, form)
    problem: str | None = None
    job: jobs.Job | None = None
    who = who_is(request)
    try:  # refused now, before an uploaded image is decoded (asked again when queued)
        await check_limits(svc, who)
    except errors.UsageError as exc:
        problem = errors.sentence(_(str(exc)))
    inputs: list[jobs.InputImage] = []
    for name in entry.workflow.image_params:
        if problem is None:
            try:
                inputs.append(await _input_image(svc, account, name, form))
            except errors.UsageError as exc:
                field_errors[name] = errors.sentence(_(str(exc)))
        values[name] = IMAGE_PLACEHOLDER
    if not field_errors and problem is None:
        try:
            job = await queue(svc, who, entry, values, inputs, key=_key(account, form))
        except errors.UsageError as exc:
            problem = errors.sentence(_(str(exc)))
    if job is not None:
        raise web.HTTPSeeOther(f"/jobs/{job.id}")
    prefs = preferences(request)
    fields = forms.build_fields(
        entry,
        prefs,
        given=forms.given_strings(form),
        errors=field_errors,
        results=await result_choices(svc, account) if entry.takes_image else None,
        max_text=svc.settings.limits.max_prompt_length,
    )
    nonce = form.get("nonce")
    return render(
        request,
        "form.html",
        status=400,
        entry=entry,
        fields=fields,
        problem=problem or _("Nothing was queued: correct the fields marked below."),
        nonce=nonce if isinstance(nonce, str) else uuid.uuid4().hex,
    )


def _key(account: web_store.Account, form: Any) -> str:
    nonce = form.get("nonce")
    if not isinstance(nonce, str) or not nonce.isalnum() or len(nonce) > 64:
        nonce = uuid.uuid4().hex
    return f"web:{account.id}:{nonce}"


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", home)
    app.router.add_get("/c/{command}", form_page)
    app.router.add_post("/c/{command}", submit)
