"""`comfyveil worker`: run jobs from the database on the configured ComfyUI backends.

    comfyveil worker --config comfyveil.toml --id gpu-host-1

Any number of workers may run, on any host that reaches the database. SIGTERM or
Ctrl-C stops claiming, lets running jobs finish within the grace period and hands the
rest back; a worker killed outright loses nothing (its leases expire and the next worker
re-attaches to the prompts already on the GPUs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from pathlib import Path
from typing import Any

from comfyveil import cli, config, config_load, logs, retention, sinks
from comfyveil.anyone import runtime
from comfyveil.cli import _operate
from comfyveil.comfy import limits as comfy_limits
from comfyveil.comfy import pool
from comfyveil.store import database
from comfyveil.worker import Worker, WorkerOptions
from comfyveil.worker import options as worker_options


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "worker",
        help=cli.SUBCOMMANDS["worker"],
        description="Claim jobs from the database and run them on the backends of the "
        "configuration file, until SIGTERM or Ctrl-C.",
    )
    parser.add_argument("--config", type=Path, default=None, metavar="FILE")
    parser.add_argument(
        "--id", dest="worker_id", default=None, metavar="NAME",
        help="this worker's name in the job log (default: host-pid-random)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, metavar="DIR",
        help="also write every finished job's outputs into DIR",
    )
    parser.add_argument(
        "--grace", type=float, default=None, metavar="SECONDS",
        help="on stop, how long running jobs may take to finish before they are handed back "
             "(default: [worker] stop_grace)",
    )
    parser.set_defaults(handler=run)


def options_from(settings: config.Settings, args: argparse.Namespace) -> WorkerOptions:
    return WorkerOptions(
        worker_id=args.worker_id or "",
        lease_seconds=settings.worker.lease_seconds,
        poll_interval=settings.worker.poll_interval,
        job_timeout=settings.worker.job_timeout,
        shutdown_grace=args.grace if args.grace is not None else settings.worker.stop_grace,
        max_wait_offline=settings.worker.max_wait_offline,
    )


def say_unreachable(backends: pool.Pool) -> None:
    """One line on stderr per backend the first probe could not reach: the operator hears
    of it at start, not from a user whose job waits. Later changes go to the log."""
    for backend in backends.backends.values():
        if not backend.healthy:
            reason = backend.last_error or f"backend {backend.name} cannot be reached"
            if f"backend {backend.name}" not in reason:
                reason = f"backend {backend.name}: {reason}"
            print(f"comfyveil: {reason}; jobs wait for the GPUs that answer",
                  file=sys.stderr, flush=True)


async def run(args: argparse.Namespace) -> int:
    settings = config_load.load(args.config)
    logs.apply_settings(settings)
    delivery = [sinks.FileSink(args.out)] if args.out is not None else []
    async with await database.Database.open(settings) as db:
        await db.commands.seed()
        async with (
            runtime.anon_for(settings, settings.backend_list()) as router,
            pool.Pool(settings.backend_list(), proxy_for=router.proxy_for,
                      on_down=router.backend_down, limits=comfy_limits.outputs(settings.limits),
                      routing=settings.worker.routing, memory=db.model_lists) as backends,
        ):
            say_unreachable(backends)
            options = options_from(settings, args)
            worker = Worker(db, backends, sinks=delivery, options=options)

            def on_signal() -> None:  # the grace is the whole stop, closing included
                worker.stop(deadline=worker_options.stop_deadline(
                    options.shutdown_grace, time.monotonic()))

            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, on_signal)
            purge = asyncio.create_task(
                retention.purge_forever(db, settings.privacy, backends=backends),
                name="retention",
            )
            try:
                async with _operate.operated(settings, db=db, pool=backends, worker=worker):
                    await worker.run()
            finally:
                purge.cancel()
                for signum in (signal.SIGTERM, signal.SIGINT):
                    with contextlib.suppress(Exception):
                        loop.remove_signal_handler(signum)
    return 0
