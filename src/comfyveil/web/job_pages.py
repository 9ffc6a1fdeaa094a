"""A job's page and its results, history, gallery, settings and forgetting.

Results and input images are served only to the account whose job made them; a job id
is a random UUID and every request checks the owner, and anything else (another user's
job, a mistyped id) gets the same "nothing here" page.
"""

from __future__ import annotations

import asyncio
import collections
import io
import time
import uuid
import warnings
from typing import Any

from aiohttp import web
from PIL import Image

from comfyveil import errors, i18n, images, sinks
from comfyveil import tasks as background
from comfyveil.desk import availability, failures
from comfyveil.desk import jobs as desk_jobs
from comfyveil.desk import language as web_language
from comfyveil.desk import state as job_state
from comfyveil.desk import words as desk_words
from comfyveil.desk.jobs import owned_output
from comfyveil.desk.language import CHOICE
from comfyveil.desk.submit import queue
from comfyveil.desk.words import status_word
from comfyveil.i18n import _
from comfyveil.images import MIMES
from comfyveil.store import accounts as web_store
from comfyveil.store import api_keys, jobs, webhooks
from comfyveil.web import auth
from comfyveil.web.page import (
    WebServices,
    preferences,
    render,
    require_account,
    services,
    when,
    who_is,
)

REFRESH_SECONDS = 2
PAGE_SIZE = 24  # history rows per page
GALLERY_PAGE = 50  # thumbnails per gallery page (a few KB each)
THUMB_SIZE = 320
THUMB_CACHE = 512  # thumbnails kept in memory (a few KB each)
THUMB_DECODERS = 2  # thumbnails decoded at once
# What a user owns stays out of the browser's cache: after logout or /forget nothing of it
# is left on the device, which others may share.
NO_STORE = "no-store"


def _job_id(request: web.Request) -> uuid.UUID:
    try:
        return uuid.UUID(request.match_info["job"])
    except ValueError:
        raise web.HTTPNotFound() from None


async def owned_job(request: web.Request) -> tuple[web_store.Account, jobs.Job]:
    account = require_account(request)
    job = await services(request).db.jobs.get(_job_id(request))
    if job is None or job.user_id != account.user_id:
        raise web.HTTPNotFound()
    return account, job


async def job_page(request: web.Request) -> web.Response:
    account = require_account(request)
    svc = services(request)
    found = await svc.web.job_with_files(_job_id(request))
    if found is None or found[0].user_id != account.user_id:
        raise web.HTTPNotFound()
    job, outputs, inputs = found
    position = eta = None
    if job.status in (jobs.Status.QUEUED, jobs.Status.RUNNING):
        # The one ETA every front end shows (store/eta.py); the place only moves forward,
        # the ETA does not jump back up.
        wait = await svc.db.jobs.wait(job.id, backends=svc.backends_up(), slots=svc.slots())
        eta = svc.etas.seconds(job.id, wait.seconds if wait else None, time.monotonic())
        if wait is not None and wait.place is not None:
            position = svc.places.place(job.id, wait.place)
        elif job.status is jobs.Status.QUEUED:
            # claimed between the two reads: show where it stands now, not as a queued
            # job with no place in the queue
            job = await svc.db.jobs.get(job.id) or job
    # One state for every front end (desk/state.py), shown only forward: a prompt waiting
    # in a GPU's own queue is not "running", and running time counts from its start.
    seen = svc.states.shown(job.id, job_state.of(job, place=position))
    if seen.stage is not job_state.Stage.QUEUED:
        position = None
    if job.status is not jobs.Status.SUCCEEDED:
        outputs = []
    who = who_is(request)
    edits = availability.edits(svc.pool, [e for e in await svc.registry.all() if e.allows(who)])
    return render(
        request,
        "job.html",
        job=job,
        state=seen,
        # the first in line in words, as the chat and the CLI say it; later places by number
        position=_(desk_words.NEXT_IN_LINE) if desk_words.next_in_line(position) else position,
        eta=eta if not seen.stage.finished else None,
        elapsed=seen.running_s,
        percent=seen.percent if seen.stage is job_state.Stage.RUNNING else None,
        step=seen.step,
        steps=seen.steps,
        # stored in English by the worker ("waiting for a GPU"): said in the page's language
        waiting=_(seen.note)
        if seen.note
        # claimed by a worker, being handed to a GPU: no place in the queue any more
        else _("Starting…")
        if seen.stage is job_state.Stage.QUEUED and position is None
        and job.status is jobs.Status.RUNNING
        else None,
        outputs=[o for o in outputs],
        inputs=inputs,
        images=MIMES,
        edits=edits,
        refresh=None if job.status.finished else REFRESH_SECONDS,
        prompt=job.params.get("prompt"),
        seed=job.params.get("seed"),
        # One plain sentence, as the chat says it; the backend's own account (node,
        # exception, backend name) only for admins.
        failure=failures.sentence(job.error, detail=account.is_admin)
        if job.status is jobs.Status.FAILED
        else None,
        rerun=job.status.finished
        and failures.rerun_offered(job.params, str(job.status), job.error),
    )


async def cancel(request: web.Request) -> web.Response:
    account, job = await owned_job(request)
    await services(request).db.jobs.cancel(job.id, by_user=account.user_id)
    raise web.HTTPSeeOther(f"/jobs/{job.id}")


async def again(request: web.Request) -> web.Response:
    """Run the job again with a new seed (its inputs too, while they are kept)."""
    account, job = await owned_job(request)
    svc = services(request)
    if not failures.rerun_offered(job.params, str(job.status), job.error):
        return render(request, "error.html", status=400, message=_(failures.NO_RERUN))
    entry = await svc.registry.get(job.command)
    if entry is None:
        return render(
            request,
            "error.html",
            status=404,
            message=_("The command {command} is not available now.").format(
                command=f"/{job.command}"
            ),
        )
    inputs: list[jobs.InputImage] = []
    if entry.takes_image:
        inputs = await svc.db.jobs.inputs(job.id)
        if len(inputs) < len(entry.workflow.image_params):
            return render(
                request,
                "error.html",
                status=400,
                message=_(
                    "The input image of that job is no longer kept; use Edit this on a result, "
                    "or upload the image again."
                ),
            )
    values = entry.workflow.without_seeds(job.params)
    form = await request.post()
    nonce = form.get("nonce")
    if not isinstance(nonce, str) or not nonce.isalnum() or len(nonce) > 80:
        nonce = uuid.uuid4().hex
    try:
        new = await queue(
            svc, who_is(request), entry, values, inputs, key=f"web:{account.id}:{nonce}"
        )
    except errors.UsageError as exc:
        return render(request, "error.html", status=400, message=_(str(exc)))
    raise web.HTTPSeeOther(f"/jobs/{new.id}")


async def output(request: web.Request) -> web.StreamResponse:
    account = require_account(request)
    svc = services(request)
    try:
        index = int(request.match_info["index"])
    except ValueError:
        raise web.HTTPNotFound() from None
    found = await owned_output(svc, account, _job_id(request), index)
    if found is None:
        raise web.HTTPNotFound()
    # Inline only what its bytes say is an image or a video; anything else (HTML, SVG,
    # a "PNG" that is a page) is a download, never rendered on this site: a hostile GPU
    # host must not run script in our origin.
    mime = images.sniff_mime(found.data)
    response = web.Response(body=found.data, content_type=mime or "application/octet-stream")
    name = sinks.safe_name(found.filename)
    disposition = "attachment" if request.query.get("download") or mime is None else "inline"
    response.headers["Content-Disposition"] = f'{disposition}; filename="{name}"'
    response.headers["Cache-Control"] = NO_STORE
    return response


async def input_image(request: web.Request) -> web.StreamResponse:
    """An input image of the visitor's own job, while it is kept."""
    _account, job = await owned_job(request)
    try:
        index = int(request.match_info["index"])
    except ValueError:
        raise web.HTTPNotFound() from None
    kept = await services(request).db.jobs.inputs(job.id)
    if not 0 <= index < len(kept) or kept[index].mime not in MIMES:
        raise web.HTTPNotFound()
    response = web.Response(body=kept[index].data, content_type=kept[index].mime)
    response.headers["Cache-Control"] = NO_STORE
    return response


def _thumbnail(data: bytes, max_pixels: int) -> bytes | None:
    """A small WebP of `data`; None when it is not an image or has more pixels than
    `max_pixels` (read from its header, before anything is decoded: a GPU host's 320 KB
    PNG can hold 84 Mpx)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
        with im:
            if im.width * im.height > max_pixels:
                return None
            im.draft("RGB", (THUMB_SIZE, THUMB_SIZE))  # JPEG: decoded at 1/2 to 1/8 size
            im.thumbnail((THUMB_SIZE, THUMB_SIZE), reducing_gap=2.0)
            out = io.BytesIO()
            im.convert("RGB").save(out, "WEBP", quality=70)
            return out.getvalue()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return None


class Thumbnails:
    def __init__(self) -> None:
        self._cache: collections.OrderedDict[tuple[uuid.UUID, int], bytes] = (
            collections.OrderedDict()
        )
        # A gallery asks for 50 at once: two decode at a time, the rest wait their turn.
        self._decoding = asyncio.Semaphore(THUMB_DECODERS)

    async def get(self, svc: WebServices, job_id: uuid.UUID, index: int) -> bytes | None:
        key = (job_id, index)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        found = next((o for o in await svc.db.jobs.outputs(job_id) if o.index == index), None)
        if found is None or found.mime not in MIMES:
            return None
        async with self._decoding:
            thumb = await asyncio.to_thread(
                _thumbnail, found.data, svc.settings.limits.max_image_pixels
            )
        if thumb is None:
            return None
        self._cache[key] = thumb
        while len(self._cache) > THUMB_CACHE:
            self._cache.popitem(last=False)
        return thumb


THUMBS = web.AppKey("thumbnails", Thumbnails)


async def thumbnail(request: web.Request) -> web.StreamResponse:
    account = require_account(request)
    svc = services(request)
    job_id = _job_id(request)
    try:
        index = int(request.match_info["index"])
    except ValueError:
        raise web.HTTPNotFound() from None
    if await svc.web.output_owner(job_id) != account.user_id:  # checked before the cache
        raise web.HTTPNotFound()
    thumb = await request.app[THUMBS].get(svc, job_id, index)
    if thumb is None:
        raise web.HTTPNotFound()
    response = web.Response(body=thumb, content_type="image/webp")
    response.headers["Cache-Control"] = NO_STORE
    return response


def _stage(row: Any) -> job_state.Stage:
    return job_state.stage_of(row["status"], row["state"])


def _page(request: web.Request) -> int:
    try:
        return max(1, min(int(request.query.get("page", "1")), 10_000))
    except ValueError:
        return 1


async def history(request: web.Request) -> web.Response:
    account = require_account(request)
    page = _page(request)
    rows = await services(request).web.history(
        account.user_id, limit=PAGE_SIZE + 1, offset=(page - 1) * PAGE_SIZE
    )
    # Each row's time and status word made here, not by template calls per row.
    # the state in the words every front end uses (a prompt in a GPU's queue is waiting)
    shown = [
        (r, when(r["created_at"]), status_word(job_state.key(_stage(r)))) for r in rows[:PAGE_SIZE]
    ]
    return render(request, "history.html", rows=shown, page=page, more=len(rows) > PAGE_SIZE)


async def gallery(request: web.Request) -> web.Response:
    account = require_account(request)
    page = _page(request)
    items = await services(request).web.gallery(
        account.user_id, limit=GALLERY_PAGE + 1, offset=(page - 1) * GALLERY_PAGE
    )
    # Each picture's text, formatted here: one translation for the page instead of a
    # template call per picture (the gallery's cost was mostly those calls).
    alt = _("%(command)s of %(when)s")
    return render(
        request,
        "gallery.html",
        items=[
            (item, alt % {"command": i18n.ltr("/" + item.command),
                          "when": i18n.ltr(item.created_at.strftime("%Y-%m-%d %H:%M"))})
            for item in items[:GALLERY_PAGE]
        ],
        page=page,
        more=len(items) > GALLERY_PAGE,
        images=MIMES,
    )


async def settings_page(request: web.Request) -> web.Response:
    require_account(request)
    prefs = preferences(request)
    return await _settings(request, prefs, {}, saved=False)


async def _settings(
    request: web.Request,
    prefs: dict[str, Any],
    errors_: dict[str, str],
    *,
    saved: bool,
    new_key: str | None = None,
    new_secret: str | None = None,
) -> web.Response:
    account = require_account(request)
    keys = await api_keys.ApiKeyStore(services(request).db.pool).keys(account.id)
    hooks = await webhooks.WebhookStore(services(request).db.pool).endpoints(account.id)
    unlinked = account.user_id == account.chat_id  # no Telegram user yet
    return render(
        request,
        "settings.html",
        link_code=web_store.link_code(account) if unlinked else None,
        status=400 if errors_ else 200,
        prefs=prefs,
        errors=errors_,
        saved=saved,
        languages=web_language.choices(),
        keys=keys,  # listed and revoked even while the API is off: they work once it is on
        new_key=new_key,
        webhooks=hooks,
        new_secret=new_secret,
        api_on=services(request).settings.api.enabled,
        api_base=f"{request.url.origin()}/v1",
    )


async def key_create(request: web.Request) -> web.Response:
    """A new key of the images API, shown on this page once (the store keeps a digest)."""
    account = require_account(request)
    svc = services(request)
    if not svc.settings.api.enabled:
        raise web.HTTPNotFound()  # [api] enabled = false: no key to make
    form = await request.post()
    label = str(form.get("label") or "")[: api_keys.MAX_LABEL]
    key = await api_keys.ApiKeyStore(svc.db.pool).create(account.id, label)
    prefs = preferences(request)
    return await _settings(request, prefs, {}, saved=False, new_key=key)


async def key_revoke(request: web.Request) -> web.Response:
    account = require_account(request)
    try:
        key_id = int(request.match_info["key"])
    except ValueError:
        raise web.HTTPNotFound() from None
    if not await api_keys.ApiKeyStore(services(request).db.pool).revoke(account.id, key_id):
        raise web.HTTPNotFound()
    raise web.HTTPSeeOther("/settings#keys")


async def settings_save(request: web.Request) -> web.Response:
    account = require_account(request)
    svc = services(request)
    form = await request.post()
    errors_: dict[str, str] = {}
    changes: dict[str, object] = {}
    remove: list[str] = []
    steps = str(form.get("steps") or "").strip()
    if not steps:
        remove.append("steps")
    elif steps.isdigit() and 1 <= int(steps) <= 1000:
        changes["steps"] = int(steps)
    else:
        errors_["steps"] = _("Steps must be a whole number from 1 to 1000, or empty.")
    seed = str(form.get("seed") or "").strip()
    if not seed:
        changes["seed_mode"] = "random"
        remove.append("seed")
    elif seed.isdigit() and int(seed) < 2**53:
        changes.update(seed_mode="fixed", seed=int(seed))
    else:
        errors_["seed"] = _("The seed must be a whole number, 0 or more, or empty.")
    language = str(form.get("language") or "")
    if language in i18n.LANGUAGES:
        changes[CHOICE] = language
    else:  # "Automatic" (or anything unknown): the browser's language
        remove.append(CHOICE)
    if errors_:
        prefs = {"steps": steps, "seed": seed, "seed_mode": "fixed", CHOICE: language}
        return await _settings(request, prefs, errors_, saved=False)
    prefs = await svc.db.users.update_settings(account.user_id, changes, remove)
    # The page that confirms the choice is already in the chosen language.
    i18n.set_language(
        web_language.choose(prefs, request.headers.get("Accept-Language"))
    )
    return await _settings(request, prefs, {}, saved=True)


async def forget_page(request: web.Request) -> web.Response:
    require_account(request)
    return render(request, "forget.html")


async def forget(request: web.Request) -> web.Response:
    """Delete everything stored about the user: jobs, images, results, settings; the
    account too when asked (which logs out)."""
    account = require_account(request)
    svc = services(request)
    form = await request.post()
    if form.get("confirm") != "yes":
        return render(
            request,
            "forget.html",
            status=400,
            error=_("Tick the box to confirm; nothing was deleted."),
        )
    # The chat's /forget, one path for both: the running job stopped, the GPU hosts
    # cleaned now (in the background: a host may be slow to answer).
    sweeps = request.app[SWEEPS]

    def spawn(work: Any, *, name: str) -> None:
        task = asyncio.create_task(work, name=name)
        sweeps.add(task)
        task.add_done_callback(sweeps.discard)

    await desk_jobs.forget(svc.db, svc.pool, account.user_id, spawn)
    if form.get("account") == "yes":
        await svc.web.delete_account(account.id)
        response = web.HTTPSeeOther("/login?done=deleted")  # said there, not left to guess
        response.del_cookie(auth.SESSION_COOKIE, path="/")
        raise response
    raise web.HTTPSeeOther("/?done=forgotten")


SWEEPS = web.AppKey("sweeps", set)


async def _stop_sweeps(app: web.Application) -> None:
    await background.cancel_and_wait(list(app[SWEEPS]))


def add_routes(app: web.Application) -> None:
    app[THUMBS] = Thumbnails()
    app[SWEEPS] = set()
    app.on_cleanup.append(_stop_sweeps)
    app.router.add_get("/jobs/{job}", job_page)
    app.router.add_post("/jobs/{job}/cancel", cancel)
    app.router.add_post("/jobs/{job}/again", again)
    app.router.add_get("/jobs/{job}/out/{index}", output)
    app.router.add_get("/jobs/{job}/thumb/{index}", thumbnail)
    app.router.add_get("/jobs/{job}/in/{index}", input_image)
    app.router.add_get("/history", history)
    app.router.add_get("/gallery", gallery)
    app.router.add_get("/settings", settings_page)
    app.router.add_post("/settings", settings_save)
    app.router.add_post("/settings/keys", key_create)
    app.router.add_post("/settings/keys/{key}/revoke", key_revoke)
    app.router.add_get("/forget", forget_page)
    app.router.add_post("/forget", forget)
