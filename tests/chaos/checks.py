"""What must hold at the end of a chaos run, checked against what really happened.

The history says what each user was told; the database, the fake Bot API's messages and
the fake GPUs' execution counts say what happened. Each violation names the request, its
jobs and their events, so a run can be replayed with the same seed and looked into.
"""

from __future__ import annotations

import dataclasses
import html
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import aiohttp

from comfyveil.desk import failures
from tests.chaos.system import System
from tests.chaos.users import History, Request

DATABASE_DOWN = str(failures.DATABASE_DOWN)

TERMINAL = {"succeeded", "failed", "cancelled"}


@dataclasses.dataclass
class Violation:
    invariant: str
    request: str
    detail: str


@dataclasses.dataclass
class Report:
    violations: list[Violation] = dataclasses.field(default_factory=list)
    notes: Counter[str] = dataclasses.field(default_factory=Counter)
    outcomes: Counter[str] = dataclasses.field(default_factory=Counter)
    # how much work the run made: the jobs in the database at the check (those a /forget
    # deleted are gone) by their end, and the prompts the fake GPUs ran to completion
    jobs: Counter[str] = dataclasses.field(default_factory=Counter)
    prompts_run: int = 0

    def add(self, invariant: str, request: Request | None, detail: str) -> None:
        who = f"#{request.rid} {request.front} {request.token}" if request else "-"
        self.violations.append(Violation(invariant, who, detail))


async def check(
    system: System,
    history: History,
    report: Report,
    sessions: list[aiohttp.ClientSession],
    faults: Sequence[Any] = (),
) -> None:
    rows = await system.query(
        "SELECT id, status, chat_id, user_id, error, status_message_id, attempts,"
        " quota_refunded, params->>'prompt' AS prompt FROM jobs"
    )
    by_token: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        token = (row["prompt"] or "").split(" ", 1)[0]
        by_token.setdefault(token, []).append(row)
    delivered = _media_by_job(system)
    refusals = refusals_of(system, history, by_token)
    for request in history.requests:
        jobs = by_token.get(request.token, [])
        if request.forgotten:
            report.notes["requests forgotten by their user (/forget), not checked"] += 1
            report.outcomes[f"{request.front}: forgotten"] += 1
            continue
        for job in jobs:
            if job["status"] not in TERMINAL:
                report.add(
                    "every accepted job ends",
                    request,
                    f"job {job['id']} is still {job['status']} " + await _events(system, job["id"]),
                )
            elif job["status"] == "failed" and not job["quota_refunded"]:
                # every request of the run is valid: no failure is its user's doing
                report.add(
                    "a failure not the user's gives the quota back",
                    request,
                    f"job {job['id']} failed ({job['error']}), quota kept"
                    + await _events(system, job["id"]),
                )
        if request.front == "chat":
            await _chat(system, request, jobs, refusals, delivered, report)
            if request.told == "nothing" and not request.forgotten:
                # where it may have been lost: the faults around it (first: the detail
                # is printed cut short)
                near = [
                    f"+{f.at - request.sent_at:.1f}s {f.kind}"
                    for f in faults
                    if request.sent_at - 15 <= f.at <= request.sent_at + 120
                ]
                if report.violations and report.violations[-1].request.startswith(
                    f"#{request.rid} "
                ):
                    last = report.violations[-1]
                    last.detail = f"faults then: {near}; {last.detail}"
        elif request.front == "api":
            _api(request, jobs, report)
        elif request.front == "web":
            _web(request, jobs, report)
            await _web_page(system, sessions[int(request.user[3:])], request, jobs, report)
        elif request.front == "cli":
            _cli(request, jobs, report)
        report.outcomes[f"{request.front}: {request.told}"] += 1
    _executions(system, rows, report)
    await _leftovers(system, history, report)


async def _events(system: System, job_id: Any) -> str:
    events = await system.query(
        "SELECT kind, status, data FROM job_events WHERE job_id = %s ORDER BY id", (job_id,)
    )
    sent = await system.query(
        "SELECT sink, outcome, detail FROM deliveries WHERE job_id = %s", (job_id,)
    )
    return (
        "; events: "
        + ", ".join(f"{e['kind']}/{e['status']}" for e in events)
        + "; deliveries: "
        + ", ".join(f"{d['sink']}={d['outcome']} {d['detail']}" for d in sent)
    )


def _media_by_job(system: System) -> dict[str, list[float]]:
    """When each result the chat users received was sent, by job (the Re-roll button
    under each names it)."""
    sent: dict[str, list[float]] = {}
    for method in ("sendPhoto", "sendDocument", "sendVideo", "sendAnimation"):
        for call in system.telegram.calls(method):
            markup = call.result.get("reply_markup") or {}
            for row in markup.get("inline_keyboard", []):
                for button in row:
                    data = button.get("callback_data", "")
                    if data.startswith(("again:", "file:", "edit:")):
                        sent.setdefault(data.split(":")[1], []).append(call.at)
                        break
                else:
                    continue
                break
    return sent


async def _chat(
    system: System,
    request: Request,
    jobs: list[dict[str, Any]],
    refusals: dict[int, str],
    delivered: dict[str, list[float]],
    report: Report,
) -> None:
    bot = system.processes["run"]
    if not jobs:
        said = refusals.get(request.rid)
        if said is not None:
            report.notes[f"chat requests refused: {said[:70]}"] += 1
            request.told = "refused"
        else:
            report.add(
                "every message is answered",
                request,
                "no job and no reply; " + _bot_calls(system, request),
            )
        return
    request.told = "accepted"
    if len(jobs) > 1 + request.rerolls:
        report.add(
            "a request runs once",
            request,
            f"{len(jobs)} jobs for one message and {request.rerolls} re-rolls",
        )
    for job in jobs:
        hexid = job["id"].hex
        sent_at = sorted(delivered.get(hexid, []))
        count = len(sent_at)
        if job["status"] == "succeeded":
            if count == 0:
                report.add(
                    "a result is delivered",
                    request,
                    f"job {job['id']} succeeded, nothing sent" + await _events(system, job["id"]),
                )
            elif count > 1:
                if count == 2 and bot.ended_between(*sent_at):
                    report.notes[
                        "results sent twice across a crash of the bot (by design:"
                        " a crash between sending and recording re-sends once)"
                    ] += 1
                else:
                    report.add(
                        "a result is delivered once",
                        request,
                        f"job {job['id']} sent {count} times, at "
                        + ", ".join(f"{at - sent_at[0]:+.1f}s" for at in sent_at)
                        + f"; {bot.ends_near(sent_at[0], sent_at[-1])}"
                        + await _events(system, job["id"]),
                    )
        elif job["status"] in ("failed", "cancelled"):
            if count:
                report.add("a failed job sends no result", request, f"job {job['id']}")
            if job["status"] == "failed" and not request.cancelled and not job["error"]:
                report.add("a failure says why", request, f"job {job['id']} has no error text")
            told = _ending_told(system, request, job)
            twice = _endings_sent_at(system, request, job) if told is not None else []
            if len(twice) == 2 and bot.ended_between(*twice):
                report.notes[
                    "endings sent twice across a crash of the bot (by design, as results:"
                    " a crash between sending and recording re-sends once)"
                ] += 1
            elif told is not None:
                when = (
                    f" (at {', '.join(f'{at - twice[0]:+.1f}s' for at in twice)};"
                    f" {bot.ends_near(twice[0], twice[-1])})"
                    if twice
                    else ""
                )
                report.add(
                    "a failure is said in one sentence in the chat",
                    request,
                    f"job {job['id']} {job['status']}: {told}{when}"
                    + await _events(system, job["id"]),
                )


# The bot's answers to the run's /cancel and /forget (theirs, not a refusal of a request).
_NOT_REFUSALS = re.compile(
    r"^(Cancelled|Stopping job|Job .* has already ended|You have no jobs? |Nothing was deleted"
    r"|Deleted\.)"
)


# How long after a /cancel or /forget its answer may come: the Bot API failing or slow, a
# refusal sent again for about a minute, the bot restarting 5 s after an exit.
COMMAND_ANSWER_S = 90.0


def refusals_of(
    system: System, history: History, by_token: dict[str, list[dict[str, Any]]]
) -> dict[int, str]:
    """The sentence that answered each chat request that made no job, by request id.

    In a private chat the bot answers without quoting the message, so each such request
    takes, in order, the first answer after it that no other request took: a sent message
    with no buttons (a status message has Cancel, a /forget question Yes/No) that is not
    the answer to a /cancel or a /forget.
    """
    answers: dict[str, list[tuple[float, int | None, str]]] = {}
    questions: dict[str, list[float]] = {}  # when each /forget question was asked
    for call in system.telegram.calls("sendMessage"):
        result = call.result or {}
        text = result.get("text", "")
        chat_id = str(call.params.get("chat_id"))
        if result.get("reply_markup"):
            if any(d.startswith("forget") for d in _buttons_of(result)):
                questions.setdefault(chat_id, []).append(call.at)
            continue
        quoted = (result.get("reply_to_message") or {}).get("message_id")
        answers.setdefault(chat_id, []).append((call.at, quoted, text))
    # A /cancel or /forget takes its own answer first (a /forget's is its question, which
    # no request could take); without one in time, the database sentence it got instead.
    # Bounded in time: a command left with no answer of its own (the bot restarted as it
    # came) must not take a later request's sentence.
    for sent_at, chat_id, kind in sorted(history.commands):
        chat = answers.get(chat_id, [])
        window = (sent_at - 0.5, sent_at + COMMAND_ANSWER_S)
        if kind == "forget":
            asked = [at for at in questions.get(chat_id, []) if window[0] <= at <= window[1]]
            if asked:
                questions[chat_id].remove(asked[0])
                continue
        own = [
            i
            for i, (at, _q, text) in enumerate(chat)
            if window[0] <= at <= window[1] and _NOT_REFUSALS.match(text)
        ]
        anything = [
            i
            for i, (at, _q, text) in enumerate(chat)
            if window[0] <= at <= window[1] and text == DATABASE_DOWN
        ]
        if own or anything:
            del chat[(own or anything)[0]]
    found: dict[int, str] = {}
    for request in history.requests:
        if request.front != "chat" or request.forgotten or by_token.get(request.token):
            continue
        chat = answers.get(request.user, [])
        for index, (at, quoted, text) in enumerate(chat):
            if (
                at >= request.sent_at - 0.5
                and quoted in (None, request.message_id)
                and not _NOT_REFUSALS.match(text)
            ):
                found[request.rid] = text
                del chat[index]
                break
    return found


def _buttons_of(message: dict[str, Any]) -> list[str]:
    markup = message.get("reply_markup") or {}
    return [b.get("callback_data", "") for row in markup.get("inline_keyboard", []) for b in row]


def _bot_calls(system: System, request: Request, seconds: float = 120) -> str:
    """What the bot asked of the Bot API in this chat after the request (with the calls
    that failed, and why), and the faults then: to see where an answer was lost."""
    calls = [
        c
        for c in system.telegram.sent
        if str(c.params.get("chat_id")) == request.user
        and request.sent_at - 1 <= c.at <= request.sent_at + seconds
    ]
    said = ", ".join(
        f"+{c.at - request.sent_at:.1f}s {c.method}"
        + ("" if c.ok else f" FAILED {c.error}")
        + (f" {str(c.params.get('text', ''))[:60]!r}" if c.method == "sendMessage" else "")
        for c in calls
    )
    return f"bot calls in the chat: [{said}]"


def _ending_told(system: System, request: Request, job: dict[str, Any]) -> str | None:
    """None when the chat shows the job's ending sentence once (its status message turned
    into it, or one reply saying it); else what the chat shows instead."""
    want = failures.sentence(job["error"]) if job["status"] == "failed" else "Cancelled."
    messages = system.telegram.messages(job["chat_id"])
    if job["status_message_id"] is not None:
        shown = next((m for m in messages if m["message_id"] == job["status_message_id"]), None)
        if shown is None:
            return None  # deleted: the chat user removed it, or a /forget did
        text = shown.get("text", "")
        return None if text == want else f"its status message says {text!r}, not {want!r}"
    replies = [
        m
        for m in messages
        if m.get("from", {}).get("is_bot")
        and (m.get("reply_to_message") or {}).get("message_id") == request.message_id
        and m.get("text") == want
    ]
    if len(replies) == 1:
        return None
    return f"{len(replies)} messages say {want!r}"


def _endings_sent_at(system: System, request: Request, job: dict[str, Any]) -> list[float]:
    """When each reply to the request saying the job's ending was sent, oldest first."""
    want = failures.sentence(job["error"]) if job["status"] == "failed" else "Cancelled."
    return sorted(
        call.at
        for call in system.telegram.calls("sendMessage")
        if str(call.params.get("chat_id")) == str(job["chat_id"])
        and (call.result or {}).get("text") == want
        and ((call.result or {}).get("reply_to_message") or {}).get("message_id")
        == request.message_id
    )


def _api(request: Request, jobs: list[dict[str, Any]], report: Report) -> None:
    # A job that failed through no fault of the user's gave its quota back: the SDK's
    # retry of the error it answered queues a new job, and the user has paid once.
    paid = [j for j in jobs if not (j["status"] == "failed" and j["quota_refunded"])]
    if len(paid) > 1:
        report.add(
            "a retry never pays twice",
            request,
            f"{len(jobs)} jobs for one images.generate: "
            + ", ".join(f"{j['id']}={j['status']}" for j in jobs),
        )
    elif len(jobs) > 1:
        report.notes["API requests retried after their job failed (its quota given back)"] += 1
    if request.told == "result" and not any(j["status"] == "succeeded" for j in jobs):
        report.add("a result comes from a job", request, "an image with no succeeded job")
    if request.told in ("nothing", "error"):
        ran = [j for j in jobs if j["status"] == "succeeded"]
        if ran:
            report.notes["API requests whose client gave up after its job ran"] += 1


def _web(request: Request, jobs: list[dict[str, Any]], report: Report) -> None:
    if request.told == "accepted":
        ids = {str(j["id"]) for j in jobs}
        if set(request.job_ids) - ids:
            report.add("an accepted job is kept", request, f"job {request.job_ids} is gone")
    elif request.told == "error":
        report.add("no server error", request, request.detail)
    if len(jobs) > 1:
        report.add("a request runs once", request, f"{len(jobs)} jobs for one form")


async def _web_page(
    system: System,
    session: aiohttp.ClientSession,
    request: Request,
    jobs: list[dict[str, Any]],
    report: Report,
) -> None:
    """The job page shows the job's end as the database holds it: the image (that
    downloads), the failure sentence, or "Cancelled."."""
    for job in jobs:
        if job["status"] not in TERMINAL:
            continue
        url = f"{system.web_url}/jobs/{job['id']}"
        try:
            async with session.get(url) as response:
                page = await response.text()
                status = response.status
            shown = re.search(r'class="status status-(\w+)"', page)
            problem = None
            if status != 200 or shown is None:
                problem = f"the page answers {status}"
            elif shown.group(1) != job["status"]:
                problem = f"the page says {shown.group(1)}"
            elif job["status"] == "succeeded":
                async with session.get(f"{url}/out/0") as response:
                    body = await response.read()
                    if response.status != 200 or not body:
                        problem = f"the result answers {response.status}"
            elif job["status"] == "failed":
                said = re.search(r'<p class="problem">([^<]*)</p>', page)
                if said is None or not html.unescape(said.group(1)).strip():
                    problem = "no failure sentence"
        except aiohttp.ClientError as exc:
            problem = f"{type(exc).__name__}"
        if problem:
            report.add(
                "the job page shows the job's end",
                request,
                f"job {job['id']} {job['status']}: {problem}" + await _events(system, job["id"]),
            )


def _cli(request: Request, jobs: list[dict[str, Any]], report: Report) -> None:
    if request.told == "error":
        report.add("no stack trace", request, request.detail)
    if request.told == "result" and not any(j["status"] == "succeeded" for j in jobs):
        report.add("a result comes from a job", request, "exit 0 with no succeeded job")
    if len(jobs) > 1:
        report.add("a request runs once", request, f"{len(jobs)} jobs for one submit")


def _executions(system: System, rows: list[dict[str, Any]], report: Report) -> None:
    counts: Counter[str] = Counter()
    mid_run: set[str] = set()
    before_fetch: set[str] = set()
    for gpu in system.gpus:
        counts.update(gpu.all_executions())
        mid_run |= gpu.lost_mid_run
        before_fetch |= gpu.lost_before_fetch
    report.prompts_run = len(counts)
    report.jobs.update(str(row["status"]) for row in rows)
    for row in rows:
        prompt_id = str(row["id"])
        runs = counts.get(prompt_id, 0)
        allowed = 2 if prompt_id in mid_run | before_fetch else 1
        if runs > allowed:
            report.add(
                "a prompt runs to completion once",
                None,
                f"job {prompt_id} ran {runs} times ({row['status']}); "
                f"{_gpu_story(system, prompt_id)}",
            )
        elif runs == 2 and prompt_id in mid_run:
            report.notes["prompts run again after their GPU lost its queue mid-run"] += 1
        elif runs == 2:
            report.notes["prompts run again after their GPU restarted before the images "
                         "were fetched (a download held up, then the GPU crashed)"] += 1


def _gpu_story(system: System, prompt_id: str) -> str:
    """Where a prompt ran, to replay a violation: runs per GPU and any losses seen."""
    parts = []
    for gpu in system.gpus:
        runs = gpu.all_executions().get(prompt_id, 0)
        if runs:
            posted = sum(1 for p in gpu.fake.prompts if p.get("prompt_id") == prompt_id)
            parts.append(f"{gpu.name}: {runs} run(s), {posted} post(s)")
    return ", ".join(parts) or "no GPU ran it"


async def _leftovers(system: System, history: History, report: Report) -> None:
    requests = {r.token: r for r in history.requests}
    for gpu in system.gpus:
        for path, token in gpu.leftovers():
            jobs = (
                await system.query(
                    "SELECT id FROM jobs WHERE params->>'prompt' LIKE %s", (f"{token} %",)
                )
                if token
                else []
            )
            events = "".join([await _events(system, j["id"]) for j in jobs])
            report.add(
                "nothing of a user's left on a GPU host",
                requests.get(token),
                f"{gpu.name}: {path} (jobs {[str(j['id']) for j in jobs]}){events}",
            )
        entries = list(gpu.fake.history_entries)
        if entries:
            report.add(
                "no history entry left",
                None,
                f"{gpu.name}: {len(entries)} entries, e.g. {entries[:3]}",
            )
