"""`comfyveil worker`, `submit` and `jobs` as real processes against PostgreSQL and fakes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from pathlib import Path

import pytest

from comfyveil import sinks
from comfyveil.store import database, jobs
from tests import zygote
from tests.integration.worker_support import (
    enqueue,
    never,
    running_worker,
    wait_for,
    wait_status,
)
from tests.web.support import new_account

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def write_config(
    path: Path, db_url: str, urls: list[str], *, lease: float = 2.0, no_trace: bool | str = True
) -> Path:
    keep = "" if no_trace is True else f"no_trace = {json.dumps(no_trace)}\n"
    backends = "".join(
        f'[[backends]]\nname = "gpu{i}"\nurl = "{url}"\nvia = "direct"\n{keep}\n'
        for i, url in enumerate(urls)
    )
    path.write_text(
        f'[database]\nurl = "{db_url}"\n\n{backends}'
        f"[worker]\nlease_seconds = {lease}\npoll_interval = 0.5\n"
    )
    return path


async def cli(*args: str, cwd: Path) -> zygote.Process:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return await zygote.comfyveil(
        *args, cwd=cwd, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )


async def run_cli(*args: str, cwd: Path, timeout: float = 60) -> tuple[int, str, str]:
    proc = await cli(*args, cwd=cwd)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_worker_killed_with_sigkill_mid_job_loses_nothing_and_pays_once(
    db: database.Database, database_url: str, fake_comfy_factory, tmp_path: Path
) -> None:
    fake = await fake_comfy_factory(step_delay=0.25)
    cfg = write_config(tmp_path / "comfyveil.toml", database_url, [fake.url])
    first_out = tmp_path / "first"
    proc = await cli("worker", "--config", str(cfg), "--id", "doomed", "--out", str(first_out),
                     cwd=tmp_path)
    try:
        job = await enqueue(db, steps=8)

        async def submitted_and_running() -> bool:
            current = await db.jobs.get(job.id)
            return bool(current and current.submitted) and fake.running is not None

        await wait_for(submitted_and_running, timeout=30)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    sink = sinks.FileSink(tmp_path / "second")
    async with running_worker(db, [fake.url], delivery=[sink]):
        done = await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=30)
        await wait_for(lambda: _true(len(sink.delivered) == 1), timeout=10)
        await never(lambda: _true(len(sink.delivered) > 1), within=1.5)  # still once
    assert fake.executions[str(job.id)] == 1
    assert done.attempts == 2 and done.backend == "gpu0"
    assert len(sink.delivered) == 1 and not first_out.exists()
    kinds = [e.kind for e in await db.jobs.events(job.id)]
    assert kinds.count("submitted") == 1 and "lease_expired" in kinds
    assert fake.history_entries == {} and await db.traces.settled() == []


async def test_worker_killed_mid_job_with_memory_its_successor_gets_the_frames(
    db: database.Database, database_url: str, fake_comfy_factory, tmp_path: Path
) -> None:
    """With `no_trace = "memory"` (the operator's choice this test is about) the images
    go to the socket id the prompt was posted with: the successor takes that id over
    while the prompt still runs, and pays once."""
    fake = await fake_comfy_factory(step_delay=0.75)  # 6 s on the GPU, a 2 s lease
    cfg = write_config(tmp_path / "comfyveil.toml", database_url, [fake.url],
                       no_trace="memory")
    proc = await cli("worker", "--config", str(cfg), "--id", "doomed", cwd=tmp_path)
    try:
        job = await enqueue(db, steps=8)

        async def submitted_and_running() -> bool:
            current = await db.jobs.get(job.id)
            return bool(current and current.submitted) and fake.running is not None

        await wait_for(submitted_and_running, timeout=30)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    async with running_worker(db, [fake.url], no_trace="memory"):
        done = await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=30)
    assert fake.executions[str(job.id)] == 1 and done.attempts == 2
    (output,) = await db.jobs.outputs(job.id)
    assert output.data.startswith(b"\x89PNG")
    assert fake.history_entries == {} and await db.traces.settled() == []


async def _true(value: bool) -> bool:
    return value


async def test_sigterm_hands_running_jobs_back_to_be_reattached(
    db: database.Database, database_url: str, fake_comfy_factory, tmp_path: Path
) -> None:
    fake = await fake_comfy_factory(step_delay=0.3)
    cfg = write_config(tmp_path / "comfyveil.toml", database_url, [fake.url], lease=30)
    proc = await cli("worker", "--config", str(cfg), "--grace", "0.2", cwd=tmp_path)
    job = await enqueue(db, steps=8)
    await wait_for(lambda: _true(fake.running is not None), timeout=30)
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 20) == 0
    released = await db.jobs.get(job.id)
    assert released is not None and released.status is jobs.Status.QUEUED
    assert released.submitted and released.backend == "gpu0"  # kept for re-attaching
    async with running_worker(db, [fake.url]):
        done = await wait_status(db, job.id, jobs.Status.SUCCEEDED, timeout=30)
    assert fake.executions[str(job.id)] == 1 and done.attempts == 1


async def test_submit_wait_prints_saved_paths_and_jobs_shows_it(
    db: database.Database, database_url: str, fake_comfy_factory, tmp_path: Path
) -> None:
    fake = await fake_comfy_factory()
    cfg = write_config(tmp_path / "comfyveil.toml", database_url, [fake.url])
    out = tmp_path / "out"
    async with running_worker(db, [fake.url]):
        code, stdout, stderr = await run_cli(
            "submit", "f", "a", "lighthouse", "--set", "steps=2", "--set", "width=256",
            "--set", "height=256", "--wait", "--out", str(out), "--config", str(cfg),
            cwd=tmp_path,
        )
    assert code == 0, stderr
    paths = [Path(line) for line in stdout.splitlines()]
    assert len(paths) == 1 and paths[0].parent == out
    assert paths[0].read_bytes().startswith(b"\x89PNG")
    job_id = stderr.splitlines()[0].removeprefix("job ").strip()
    assert paths[0].name == f"f-{job_id}-1.png"  # known before it ends, not ComfyUI_temp_...
    assert fake.executions[job_id] == 1

    code, listing, _ = await run_cli("jobs", "list", "--config", str(cfg), cwd=tmp_path)
    assert code == 0 and job_id in listing and "succeeded" in listing
    code, shown, _ = await run_cli("jobs", "show", job_id, "--config", str(cfg), cwd=tmp_path)
    # the state in the words every front end uses (the chat and the web say "done")
    assert code == 0 and "status   done" in shown and "claimed" in shown


async def test_jobs_cancel_a_queued_job_from_the_command_line(
    db: database.Database, database_url: str, fake_comfy_factory, tmp_path: Path
) -> None:
    fake = await fake_comfy_factory()
    cfg = write_config(tmp_path / "comfyveil.toml", database_url, [fake.url])
    code, stdout, stderr = await run_cli(
        "submit", "f", "a cat", "--set", "width=256", "--set", "height=256",
        "--config", str(cfg), cwd=tmp_path,
    )
    assert code == 0, stderr
    job_id = stdout.strip()
    code, stdout, _ = await run_cli("jobs", "cancel", job_id, "--config", str(cfg), cwd=tmp_path)
    assert code == 0 and "cancelled" in stdout
    job = await db.jobs.get(__import__("uuid").UUID(job_id))
    assert job is not None and job.status is jobs.Status.CANCELLED
    # Again: nothing is cancelled now, and the answer says so (it said "cancelled", 0).
    code, stdout, stderr = await run_cli("jobs", "cancel", job_id, "--config", str(cfg),
                                         cwd=tmp_path)
    assert code == 1 and stdout == ""
    assert stderr.strip() == (f"comfyveil: job {job_id} had already ended (cancelled); "
                              "nothing to cancel")
    code, shown, _ = await run_cli("jobs", "show", job_id, "--config", str(cfg), cwd=tmp_path)
    assert code == 0 and "status   cancelled\n" in shown  # not "cancelled: cancelled"
    code, _, stderr = await run_cli("jobs", "show", "not-an-id", "--config", str(cfg),
                                    cwd=tmp_path)
    assert code == 2 and "is not a job id" in stderr and "Traceback" not in stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nosuchcommand", "a cat"], "unknown command nosuchcommand"),
        (["f", "a cat", "--set", "steps=99"], "steps"),
        (["f", "a cat", "--set", "colour=red"], "unknown option"),
        (["f", "a cat", "--image", "missing.png"], "takes no image"),
    ],
)
async def test_submit_refuses_bad_input_before_anything_is_queued(
    db: database.Database, database_url: str, tmp_path: Path, args: list[str], message: str
) -> None:
    cfg = write_config(tmp_path / "comfyveil.toml", database_url, ["http://127.0.0.1:9"])
    code, stdout, stderr = await run_cli("submit", *args, "--config", str(cfg), cwd=tmp_path)
    assert code == 2, stderr
    assert message in stderr and "Traceback" not in stderr and stdout == ""
    assert await db.jobs.list_for_user(0) == []


async def test_jobs_shows_every_users_jobs_and_takes_the_short_id_the_chat_shows(
    db: database.Database, database_url: str, tmp_path: Path
) -> None:
    """The operator at the command line sees the whole queue (issue 23 item 11), and the
    `#226bb674` a chat user quotes names the job."""
    from tests.integration.test_store_jobs import new_job

    chat_job = await db.jobs.enqueue(new_job(77))
    other = await db.jobs.enqueue(new_job(78))
    cfg = write_config(tmp_path / "comfyveil.toml", database_url, ["http://127.0.0.1:9"])
    for args in ((), ("list",), ("list", "--all")):
        code, everyone, _ = await run_cli("jobs", *args, "--config", str(cfg), cwd=tmp_path)
        assert code == 0 and str(chat_job.id) in everyone and "queued" in everyone, args
        assert str(other.id) in everyone
    code, one_user, _ = await run_cli("jobs", "list", "--user", "78", "--config", str(cfg),
                                      cwd=tmp_path)
    assert code == 0 and str(other.id) in one_user and str(chat_job.id) not in one_user

    short = chat_job.id.hex[:8]
    for ref in (short, f"#{short}", short.upper()):
        code, shown, err = await run_cli("jobs", "show", ref, "--config", str(cfg),
                                         cwd=tmp_path)
        assert code == 0, err
        assert f"job      {chat_job.id}" in shown and "status   queued" in shown
    code, _, err = await run_cli("jobs", "show", "0000000f", "--config", str(cfg),
                                 cwd=tmp_path)
    assert code == 2 and "there is no job 0000000f" in err and "Traceback" not in err
    code, out, err = await run_cli("jobs", "cancel", f"#{short}", "--config", str(cfg),
                                   cwd=tmp_path)
    assert code == 0 and "cancelled" in out, err


def _own_workflow(folder: Path, name: str, command: str, prefix: str) -> Path:
    """A copy of the shipped Flux Schnell workflow as the submitter's own NAME.toml, with
    its own command and its own SaveImage prefix (so the graph that ran can be told)."""
    from comfyveil.comfy import workflow

    shipped = workflow.find("f")
    assert shipped.source is not None
    folder.mkdir(parents=True, exist_ok=True)
    toml_text = shipped.source.read_text().replace('command = "f"', f'command = "{command}"')
    assert f'command = "{command}"' in toml_text
    graph = shipped.source.with_suffix(".json").read_text()
    assert '"comfyveil/f"' in graph
    (folder / f"{name}.toml").write_text(toml_text)
    (folder / f"{name}.json").write_text(graph.replace('"comfyveil/f"', f'"{prefix}"'))
    return folder / f"{name}.toml"


async def _names(db: database.Database, job_id: str) -> list[str]:
    return [o.filename for o in await db.jobs.outputs(uuid.UUID(job_id))]


async def test_submit_a_path_runs_that_exact_graph_on_a_worker_elsewhere(
    db: database.Database, database_url: str, fake_comfy_factory, tmp_path: Path
) -> None:
    fake = await fake_comfy_factory()
    submitter, worker_host = tmp_path / "submitter", tmp_path / "worker"
    worker_host.mkdir()
    cfg = write_config(tmp_path / "comfyveil.toml", database_url, [fake.url])
    # a variant of /f (same command, another graph) and a command no one registered
    variant = _own_workflow(submitter / "flows", "variant", "f", "variant/fv")
    _own_workflow(submitter / "flows", "mine", "mine", "mine/m")  # run as flows/mine.toml
    size = ["--set", "steps=2", "--set", "width=256", "--set", "height=256"]
    code, stdout, stderr = await run_cli(
        "submit", str(variant), "a", "lighthouse", *size, "--config", str(cfg), cwd=submitter)
    assert code == 0, stderr
    variant_id = stdout.strip()
    code, stdout, stderr = await run_cli(
        "submit", "flows/mine.toml", "a", "fox", *size, "--config", str(cfg), cwd=submitter)
    assert code == 0, stderr
    mine_id = stdout.strip()
    for path in (submitter / "flows").iterdir():
        path.unlink()  # the worker never sees the submitter's files

    proc = await cli("worker", "--config", str(cfg), "--id", "elsewhere", cwd=worker_host)
    try:
        for job_id in (variant_id, mine_id):
            done = await wait_status(db, uuid.UUID(job_id), jobs.Status.SUCCEEDED, timeout=60)
            assert done.error is None
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
    # The graph's SaveImage prefix names the results (the GPU host saw a PreviewImage).
    assert await _names(db, variant_id) == ["fv_00001_.png"]
    assert await _names(db, mine_id) == ["m_00001_.png"]
    assert (await db.jobs.get(uuid.UUID(mine_id))).command == "mine"  # type: ignore[union-attr]


async def test_submit_a_path_that_is_not_a_workflow_is_refused(
    db: database.Database, database_url: str, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "comfyveil.toml", database_url, ["http://127.0.0.1:9"])
    (tmp_path / "broken.toml").write_text('command = "broken"\n')  # no broken.json beside it
    for path, message in (("missing.toml", "cannot read workflow file missing.toml"),
                          ("broken.toml", "cannot read")):
        code, stdout, stderr = await run_cli("submit", path, "a cat", "--config", str(cfg),
                                             cwd=tmp_path)
        assert code == 2, stderr
        assert message in stderr and "Traceback" not in stderr and stdout == ""
    assert await db.jobs.list_for_user(0) == []


async def test_web_apikey_prints_the_sites_own_base_url(
    db: database.Database, database_url: str, tmp_path: Path
) -> None:
    """It printed "the base URL <your site>/v1" though it knows the site's address."""
    await new_account(db, "keyholder")
    cfg = write_config(tmp_path / "comfyveil.toml", database_url, ["http://127.0.0.1:9"])
    cfg.write_text(cfg.read_text() + '[web]\npublic_url = "https://art.example.org"\n')
    code, out, err = await run_cli("web", "apikey", "keyholder", "--config", str(cfg),
                                   cwd=tmp_path)
    assert code == 0, err
    assert "the base URL https://art.example.org/v1)" in out and "<your site>" not in out
