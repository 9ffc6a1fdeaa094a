"""Validating and queueing a job, for every front end: who may run the command now, what
the content policy reads and refuses, the job as the store takes it (the limits, cooldown
included, counted with it in one statement; the front end's key makes a retried request
never a second job), and the values a re-run sends again.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence

from comfyveil import config, errors
from comfyveil import policy as policy_mod
from comfyveil.comfy import workflow
from comfyveil.desk import access, availability, failures, registry
from comfyveil.desk.services import Desk, PolicyDesk, PoolDesk
from comfyveil.i18n import _, ltr
from comfyveil.store import jobs

logger = logging.getLogger(__name__)

IMAGE_PLACEHOLDER = "telegram-input"  # replaced by the uploaded file's name on the backend


def policy_texts(wf: workflow.Workflow, values: Mapping[str, object]) -> list[str]:
    """What the content policy reads of a job's values: the texts the workflow draws from,
    not the negative prompt (``--no gore`` asks for less) nor input image names."""
    skip = {"negative", *wf.image_params}
    return [v for k, v in values.items() if k not in skip and isinstance(v, str)]


def validate(
    settings: config.Settings, wf: workflow.Workflow, values: Mapping[str, object]
) -> dict[str, object]:
    """`wf.validate` with the operator's ``[limits] max_prompt_length`` bounding every text
    value (a workflow's own lower ``max_length`` still binds): one rule for the chat, the
    pages, the API and ``comfyveil submit``.

    Raises:
        ParamError: one plain sentence naming the option; for the prompt, the chat's own
            sentence, so every front end refuses a long prompt in the same words.
    """
    if wf.prompt_param is not None:
        prompt = values.get(wf.prompt_param)
        if isinstance(prompt, str):
            check_prompt_length(settings, wf, prompt)
    return wf.validate(values, max_text=settings.limits.max_prompt_length)


def check_prompt_length(settings: config.Settings, wf: workflow.Workflow, prompt: str) -> None:
    """Refuse a prompt past the binding one of ``[limits] max_prompt_length`` and the
    workflow's own ``max_length``, in the words the chat uses.

    Raises:
        ParamError: "The prompt is N characters long; the limit is M."
    """
    limit = settings.limits.max_prompt_length
    own = wf.params[wf.prompt_param].max_length if wf.prompt_param is not None else None
    if own is not None:
        limit = min(limit, own)
    if len(prompt) > limit:
        raise workflow.ParamError(
            _("The prompt is {length} characters long; the limit is {limit}.").format(
                length=ltr(len(prompt)), limit=ltr(limit)
            ),
            param=wf.prompt_param,
        )


async def check_policy(services: PolicyDesk, command: str, texts: Sequence[str]) -> None:
    """Refuse a prompt the operator's ``[policy]`` does not accept, counting the refusal
    (never its text).

    Raises:
        PromptRefused: one plain sentence; nothing is queued.
    """
    if services.policy.refuses(command, texts):
        await services.db.refusals.count(command)
        logger.info(
            "a prompt was refused by the content policy",
            extra={"action": "prompt_refused", "command": command},
        )
        raise policy_mod.PromptRefused()


async def check_allowed(services: Desk, who: access.Who, entry: registry.Entry) -> None:
    """Refuse, before anything is downloaded or decoded, a job this user may not have now:
    a command for admins only, or one over their limits (asked again when it is queued).

    Raises:
        NotAllowed: the command is not for this user's role.
        QueueLimitReached, DailyQuotaReached, CoolingDown: the user must wait.
    """
    if not entry.allows(who):
        raise access.NotAllowed(
            _("Only the bot's admins can use {command}.").format(command=ltr(f"/{entry.name}"))
        )
    await check_limits(services, who)


async def check_limits(services: Desk, who: access.Who) -> None:
    """Refuse a user who may not queue anything now (not allowed, over a limit, cooling
    down), asked by every front end before it reads or decodes an uploaded image, so a
    refused user never costs the server an image's decoding; the store asks again, and
    counts, when the job is queued.

    Raises:
        NotAllowed: banned or not allowed.
        QueueLimitReached, DailyQuotaReached, CoolingDown: the user must wait.
    """
    if not who.allowed:
        raise access.NotAllowed(_("You are not allowed to use this service."))
    await services.db.jobs.check_limits(who.user_id, **services.access.limits(who))


async def queue(
    svc: PoolDesk,
    who: access.Who,
    entry: registry.Entry,
    values: Mapping[str, object],
    inputs: Sequence[jobs.InputImage],
    *,
    key: str,
    job_id: uuid.UUID | None = None,
) -> jobs.Job:
    """Check and queue a job for `who`: the one way into the queue for every front end
    (the chat's commands, edits, /again and re-roll, the web's form, Run again and Edit
    this, the images API), so each passes the same access rule, the same content policy
    (no way in is a way around it) and the same availability rule (no job no GPU can run); then the
    limits, cooldown included, in the enqueue statement. `job_id` is the new job's id (a
    front end tells a retried request's existing job by it).

    Raises:
        UsageError: not allowed, not allowed this command, a refused prompt, no GPU can
            run it, a limit reached, a bad value.
    """
    if not who.allowed:
        raise access.NotAllowed(_("You are not allowed to use this service."))
    if not entry.allows(who):
        raise access.NotAllowed(
            _("Only the admins can use {command}.").format(command=f"/{entry.name}")
        )
    await check_policy(svc, entry.name, policy_texts(entry.workflow, values))
    await availability.confirm(svc.pool, entry)
    validated = validate(svc.settings, entry.workflow, values)
    new = jobs.NewJob(
        user_id=who.user_id,
        chat_id=who.chat_id,
        command=entry.name,
        workflow_hash=entry.workflow.hash,
        params=validated,
        inputs=tuple(inputs),
        idempotency_key=key,
        max_attempts=svc.settings.worker.max_attempts,
        **({"id": job_id} if job_id is not None else {}),
    )
    # The limits, cooldown included, are checked and counted with the job in one statement.
    return await svc.db.jobs.enqueue(new, **svc.access.limits(who))


async def again(
    services: PoolDesk, commands: registry.CommandRegistry, who: access.Who, job: jobs.Job
) -> tuple[registry.Entry, dict[str, object], list[jobs.InputImage]]:
    """What queueing `job` again (a new seed) takes: its command as it is now, the values
    (checked by the policy and validated again), its input images.

    Raises:
        UsageError: the job would not differ or would fail the same way (the rule the
            pages use to offer it), the command is off now, or the input image is no
            longer kept.
    """
    if not failures.rerun_offered(job.params, str(job.status), job.error):
        raise errors.UsageError(_(failures.NO_RERUN))
    entry = await commands.get(job.command)
    if entry is None:
        raise errors.UsageError(
            _("The command {command} is not available now.").format(command=ltr(f"/{job.command}"))
        )
    await check_allowed(services, who, entry)
    await availability.confirm(services.pool, entry)
    inputs: list[jobs.InputImage] = []
    if entry.takes_image:
        inputs = await services.db.jobs.inputs(job.id)
        if len(inputs) < len(entry.workflow.image_params):
            raise errors.UsageError(
                _(
                    "The image of that {command} job is no longer kept; send the command "
                    "again with the image."
                ).format(command=ltr(f"/{job.command}"))
            )
    values = entry.workflow.without_seeds(job.params)
    await check_policy(services, entry.name, policy_texts(entry.workflow, values))
    validated = validate(services.settings, entry.workflow, values)
    return entry, validated, inputs
