"""`comfyveil generate`: run one workflow on one ComfyUI server, save its outputs.

    comfyveil generate f an astronaut riding a horse --set steps=4 --out out/
    comfyveil generate qwen "put a red hat on it" --image photo.png

Progress goes to stderr; the saved paths go to stdout, one per line, so the command
composes with shell pipelines.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from comfyveil import cli, config, config_load
from comfyveil.anyone import runtime
from comfyveil.cli import _run_args
from comfyveil.cli._find import find_workflow
from comfyveil.comfy import client as comfy_client
from comfyveil.comfy import downloads, execute, progress_line, uploads, workflow
from comfyveil.comfy import errors as comfy_errors
from comfyveil.comfy import limits as comfy_limits
from comfyveil.desk import submit as desk_submit
from comfyveil.errors import UsageError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "generate",
        help=cli.SUBCOMMANDS["generate"],
        description="Run WORKFLOW (a shipped name, a command such as f, or a path to "
        "NAME.toml) with PROMPT on a ComfyUI server and save every output into DIR.",
    )
    _run_args.add_workflow_run(parser)
    parser.add_argument(
        "--server", default=None, metavar="URL",
        help=f"ComfyUI server (default: first configured backend, else "
        f"{config.DEFAULT_COMFYUI_URL})",
    )
    _run_args.add_out(parser)
    parser.add_argument("--config", type=Path, default=None, metavar="FILE")
    parser.add_argument(
        "--timeout", type=float, default=config.DEFAULT_JOB_TIMEOUT, metavar="SECONDS",
        help="give up when the job (upload, run and download) has not finished after this long",
    )
    parser.add_argument(
        "--keep-metadata", action="store_true",
        help="keep ComfyUI's prompt and workflow inside the saved files (to drag them back "
        "into ComfyUI); by default every output is saved without metadata",
    )
    parser.set_defaults(handler=run)


def read_images(
    wf: workflow.Workflow, paths: list[Path], settings: config.Settings
) -> dict[str, uploads.InputImage]:
    """Check each --image file and bind it to the workflow's image parameters in order."""
    names = list(wf.image_params)
    if len(paths) > len(names):
        allowed = "no image" if not names else f"{len(names)} image(s)"
        raise UsageError(f"workflow {wf.name} takes {allowed}, got {len(paths)}")
    bound: dict[str, uploads.InputImage] = {}
    for name, path in zip(names, paths, strict=False):
        checked = _run_args.read_image(path, settings)
        bound[name] = uploads.InputImage(checked.data, checked.mime)
    return bound


def server_backend(settings: config.Settings, server: str | None) -> config.BackendConfig:
    """The backend to use: --server (with a configured backend's settings when it is
    one of them, e.g. its client key), else the first configured backend."""
    if server is None:
        return settings.backend_list()[0]
    url = server.rstrip("/")
    for backend in settings.backends:
        if backend.url == url:
            return backend
    return config.BackendConfig(name="server", url=url)


def shown_url(url: str) -> str:
    """A backend's URL as an error may show it: without a user name or password."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    netloc += f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=netloc))


def _anon_progress(percent: int, summary: str) -> None:
    print(f"anon: {percent}% {summary}", file=sys.stderr, flush=True)


async def run(args: argparse.Namespace) -> int:
    settings = config_load.load(args.config)
    wf = await find_workflow(settings, args.workflow)
    values: dict[str, object] = dict(_run_args.parse_assignments(args.values))
    if args.prompt:
        if wf.prompt_param is None:
            raise UsageError(f"workflow {wf.name} takes no prompt")
        values[wf.prompt_param] = " ".join(args.prompt)
    inputs = read_images(wf, args.image, settings)
    values.update({name: image.upload_name for name, image in inputs.items()})
    # The operator's [limits] max_prompt_length binds here as on every front end.
    validated = desk_submit.validate(settings, wf, values)
    _run_args.check_timeout(args.timeout)
    _run_args.check_out(args.out)

    backend = server_backend(settings, args.server)
    run_id = str(uuid.uuid4())  # the prompt's id on the server, and its files' names here
    progress = progress_line.ProgressPrinter(sys.stderr)
    progress.set_graph(wf.graph)
    try:
        async with (
            runtime.anon_for(settings, [backend], on_progress=_anon_progress) as router,
            comfy_client.ComfyClient(
                backend.url,
                name=backend.name,
                proxy=router.proxy_for(backend),
                limits=comfy_limits.outputs(settings.limits),
            ) as client,
        ):
            # Streamed into --out as they arrive: a huge output never sits in memory.
            outcome = await execute.execute(
                client, wf, validated, inputs, prompt_id=run_id, on_event=progress.on_event,
                timeout=args.timeout, out_dir=args.out,
                no_trace=backend.no_trace, keep_metadata=args.keep_metadata,
            )
    except comfy_errors.BackendUnreachable as exc:
        # "backend server cannot be reached" alone does not say which server was tried.
        where = shown_url(backend.url)
        if isinstance(exc, comfy_errors.BackendStopped) or where in str(exc):
            raise  # reached, then lost: its sentence says during what
        raise comfy_errors.BackendUnreachable(f"{exc} (tried {where})",
                                              backend=backend.name) from exc
    finally:
        progress.close()
    for index, path in enumerate(downloads.save_outputs(outcome.files, args.out), start=1):
        print(_renamed(path, f"{wf.command}-{run_id[:8]}-{index}"))
    return 0


def _renamed(path: Path, stem: str) -> Path:
    """`path` moved to STEM.EXT beside it (STEM-2.EXT... when taken): the name a backend
    gave (``ComfyUI_temp_ornuo_00001_.png`` with no trace) says nothing, and a script
    that reads the printed paths should not need to guess. Never over an existing file."""
    counter = 0
    while True:
        target = path.with_name(f"{stem}{'' if counter == 0 else f'-{counter + 1}'}"
                                f"{path.suffix}")
        if target == path:
            return path
        try:
            os.link(path, target)  # fails when the name is taken: nothing is overwritten
        except FileExistsError:
            counter += 1
            continue
        except OSError:
            return path  # a file system without links keeps the backend's name
        path.unlink()
        return target
