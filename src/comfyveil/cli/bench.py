"""`comfyveil bench`: the seed's GPU table, measured on your own backends.

    comfyveil bench --backend 4090=http://127.0.0.1:8188 --backend 5090=http://127.0.0.1:8189
    comfyveil bench --workflow flux_schnell_full_text_to_image --runs 10 --parallel
    comfyveil bench compare old/results.json new/results.json

The live progress goes to stderr; the table goes to stdout; results.json, .csv, .md
and .png go into --out. The exit code is 1 when any measured run failed (the files
are still written, failures included).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import io
import random
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from comfyveil import cli, config, config_load
from comfyveil.anyone import daemon, routing, runtime
from comfyveil.bench import compare, report, runner
from comfyveil.cli import _run_args
from comfyveil.errors import UsageError

# The seed's table, in its order; other shipped workflows follow by name.
SEED_ORDER = (
    "sd3.5_simple_example", "flux_schnell_full_text_to_image", "flux_dev_full_text_to_image",
    "video_wan2_2_14B_t2v", "image_qwen_image_edit_2509",
)
EXIT_OK = 0
EXIT_FAILED_RUNS = 1


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help=cli.SUBCOMMANDS["bench"],
        description="Run each workflow --warmup times (not counted), then --runs times on "
        "every backend with the same seeds and parameters, and write results.json, "
        "results.csv, results.md and results.png into --out. The first backend is the "
        "base of the speedup, (t_base - t_other) / t_base.",
    )
    parser.add_argument(
        "--backend", action="append", default=[], metavar="NAME=URL",
        help="a ComfyUI server to measure (repeat; default: the configured backends)",
    )
    parser.add_argument(
        "--workflow", action="append", default=[], metavar="W",
        help="a shipped workflow name or a workflow file (repeat; default: the five "
        "shipped seed workflows)",
    )
    parser.add_argument("--runs", type=int, default=runner.DEFAULT_RUNS, metavar="N",
                        help="measured runs per workflow and backend "
                        f"(default {runner.DEFAULT_RUNS})")
    parser.add_argument("--warmup", type=int, default=runner.DEFAULT_WARMUP, metavar="N",
                        help=f"warm-up runs, not counted (default {runner.DEFAULT_WARMUP})")
    parser.add_argument(
        "--set", action="append", default=[], dest="values", metavar="NAME=VALUE",
        help="fix a workflow parameter for every run, e.g. --set steps=20 (repeatable)",
    )
    parser.add_argument("--image", type=Path, default=None, metavar="FILE",
                        help="input image for editing workflows (default: a generated test image)")
    parser.add_argument("--seed", type=int, default=None, metavar="N",
                        help="run i uses seed N+i on every backend (default: drawn at random "
                        "for each bench, so a bench run again is not answered from "
                        "ComfyUI's cache; results.json records it)")
    parser.add_argument("--metric", choices=("server", "wall"), default="server",
                        help="seconds in the table: the server's execution time (default) "
                        "or wall time from submit to done")
    parser.add_argument("--parallel", action="store_true",
                        help="run all backends at once from one shared queue and report "
                        "outputs per minute")
    parser.add_argument("--timeout", type=float, default=runner.DEFAULT_TIMEOUT,
                        metavar="SECONDS", help="give up on a run after this long")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="where to write the results (default bench-results/<UTC time>)")
    parser.add_argument("--config", type=Path, default=None, metavar="FILE")
    parser.set_defaults(handler=run_bench)

    sub = parser.add_subparsers(dest="bench_command", metavar="compare", required=False)
    cmp = sub.add_parser(
        "compare", help="print the table between two earlier results.json files",
        description="Match workflows by name; every backend of A and of B becomes a column; "
        "the base is the first backend of A.",
    )
    cmp.add_argument("a", type=Path, metavar="A.json")
    cmp.add_argument("b", type=Path, metavar="B.json")
    cmp.set_defaults(handler=run_compare)


def parse_backends(items: list[str]) -> list[runner.Backend]:
    """`NAME=URL` (or a bare URL, named gpu0, gpu1, ...) into backends."""
    backends = []
    for index, item in enumerate(items):
        name, sep, url = item.partition("=")
        if not sep:
            name, url = f"gpu{index}", item
        name, url = name.strip(), url.strip().rstrip("/")
        if not name or not url.startswith(("http://", "https://")):
            raise UsageError(
                f"--backend needs NAME=URL with an http:// or https:// URL, got {item!r}"
            )
        backends.append(runner.Backend(name, url))
    names = [b.name for b in backends]
    if len(set(names)) != len(names):
        raise UsageError("two --backend options have the same name; give each its own")
    return backends


async def load_workflows(names: list[str], settings: config.Settings) -> tuple[Any, ...]:
    """The shipped seed workflows, or those named: a shipped name, a file, a workflow under
    `[workflows] dirs`, or a command added with `comfyveil workflows add` (as `generate`)."""
    from comfyveil.cli import _find
    from comfyveil.comfy import workflow

    if names:
        return tuple(await _find.find_workflows(settings, names))
    try:
        known = await asyncio.to_thread(workflow.shipped)
    except workflow.WorkflowError as exc:
        raise UsageError(str(exc)) from exc
    order = [n for n in SEED_ORDER if n in known] + sorted(set(known) - set(SEED_ORDER))
    return tuple(known[n] for n in order)


def _read_image(path: Path) -> bytes:
    from PIL import Image, UnidentifiedImageError

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.verify()
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise UsageError(f"{path} is not an image Pillow can read") from exc
    return data


def backend_config(settings: config.Settings, name: str, url: str) -> config.BackendConfig:
    """The configured backend of that name and URL (its via, its key), else a plain one."""
    for backend in settings.backends:
        if backend.name == name and backend.url == url:
            return backend
    return config.BackendConfig(name=name, url=url)


def proxy_router(
    settings: config.Settings, anon: daemon.AnonClient | None = None
) -> runner.ProxyFor:
    """Route each backend as the configuration says: hidden services through `anon`
    (its own circuits per backend); without anon such a backend is refused plainly."""

    def proxy_for(name: str, url: str) -> str | None:
        return routing.proxy_url_for(backend_config(settings, name, url), anon)

    return proxy_for


def _anon_progress(percent: int, summary: str) -> None:
    print(f"anon: {percent}% {summary}", file=sys.stderr, flush=True)


def _default_out() -> Path:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    return Path("bench-results") / stamp


@contextmanager
def live_progress(total: int) -> Iterator[Callable[[runner.Progress], None]]:
    """A rich progress bar on stderr; yields the listener the runner calls."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=console, transient=False,
    ) as progress:
        task = progress.add_task("starting", total=total)

        def listener(event: runner.Progress) -> None:
            what = "warm-up" if event.warmup else f"run {event.run + 1}"
            if event.kind == "run_started":
                progress.update(task, description=f"{event.workflow} on {event.backend}: {what}")
                return
            progress.advance(task)
            record = event.record
            if record is not None and not record.ok:
                console.print(f"[red]{event.workflow} on {event.backend}, {what} failed:[/] "
                              f"{record.error}", highlight=False)

        yield listener


def seed_base(given: int | None) -> int:
    """The first measured run's seed: the one given, or a fresh one. A bench repeated with
    the seeds of the last one would find its last prompt in ComfyUI's cache."""
    if given is not None:
        if given < 1:
            raise UsageError("--seed must be at least 1 (warm-up runs use the seeds below it)")
        return given
    return random.randint(1_000_000, 2**31)


async def run_bench(args: argparse.Namespace) -> int:
    if args.runs < 1:
        raise UsageError("--runs must be at least 1")
    if args.warmup < 0:
        raise UsageError("--warmup cannot be negative")
    settings = config_load.load(args.config)
    backends = parse_backends(args.backend) or [
        runner.Backend(b.name, b.url) for b in settings.backend_list()
    ]
    values = _run_args.parse_assignments(args.values)
    workflows = await load_workflows(args.workflow, settings)
    runner.check_values(workflows, values)
    image = await asyncio.to_thread(_read_image, args.image) if args.image else None
    plan = runner.Plan(
        backends=tuple(backends), workflows=workflows, runs=args.runs, warmup=args.warmup,
        values=values, image=image, seed_base=seed_base(args.seed), parallel=args.parallel,
        metric=args.metric, timeout=args.timeout,
    )
    configs = [backend_config(settings, b.name, b.url) for b in backends]
    async with runtime.anon_for(settings, configs, on_progress=_anon_progress) as router:
        proxy_for = proxy_router(settings, router.anon)
        for backend in backends:  # refuse a backend we cannot route before measuring
            proxy_for(backend.name, backend.url)
        with live_progress(plan.total_runs) as listener:
            result = await runner.run(plan, proxy_for=proxy_for, on_progress=listener)
    out = args.out or _default_out()
    paths = await report.write_all(result, out)
    names = [wf.name for wf in result.workflows]
    print(report.markdown_table(*report.headline(names, report.columns(result))))
    if result.parallel is not None:
        p = result.parallel
        print(f"\nall backends at once: {p.outputs_per_minute:.2f} outputs per minute "
              f"({p.outputs} outputs in {p.wall_s:.1f} s)")
    failed = result.failed
    if failed:
        print(f"\n{len(failed)} run(s) failed; see {paths['md']}", file=sys.stderr)
    print(f"\nresults written to {out}", file=sys.stderr)
    return EXIT_FAILED_RUNS if failed else EXIT_OK


async def run_compare(args: argparse.Namespace) -> int:
    a = await asyncio.to_thread(report.load, args.a)
    b = await asyncio.to_thread(report.load, args.b)
    print(f"A: {args.a} ({a.started_at})\nB: {args.b} ({b.started_at})\n")
    print(compare.render(compare.compare(a, b)), end="")
    return EXIT_OK

