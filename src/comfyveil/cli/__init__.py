"""The `comfyveil` command line.

Each subcommand lives in its own module of this package and exposes
`register(subparsers)`, which adds its parser and sets `handler`, an
`async def handler(args) -> int` returning the exit code. `main()` only parses and
runs; errors from comfyveil become one plain line on stderr (the traceback with -v).

Exit codes: 0 success, 1 a failure elsewhere (server, database, network),
2 a usage error (bad arguments, unknown workflow, an input that is not an image).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from comfyveil import __version__, logs
from comfyveil.errors import ComfyveilError, ConfigError, UsageError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

# Subcommand modules, in the order `comfyveil --help` lists them, with their help line.
SUBCOMMANDS = {
    "run": "run the Telegram bot and the web front end with a worker and database",
    "web": "the web front end: serve it, or invite an account",
    "generate": "run a workflow once on a ComfyUI server and save its outputs",
    "submit": "queue a job for the workers (optionally wait and save its outputs)",
    "jobs": "list, show and cancel queued jobs",
    "worker": "run queued jobs on the configured ComfyUI backends",
    "workflows": "list, add, enable, disable and check chat commands",
    "models": "check and install the model files of commands on a GPU host",
    "bench": "benchmark workflows on one or more ComfyUI backends",
    "anon": "the Anyone Network client (anon)",
    "db": "database schema: migrate, status",
    "status": "one table of the database, every backend and every worker",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand; with `only`, that subcommand's whole parser and a
    bare entry for the others, so a command imports only its own module (the bot's
    imports alone take most of a second; `comfyveil --help` needs none of them)."""
    parser = argparse.ArgumentParser(
        prog="comfyveil",
        description="Private, self-hosted chat front end for ComfyUI.",
    )
    parser.add_argument("--version", action="version", version=f"comfyveil {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0,
        help="more log output; -vv also prints tracebacks",
    )
    parser.add_argument(
        "--log-format", choices=logs.FORMATS, default=None,
        help="text (default) or json: one object a line, for journald or Loki "
             "(default: [log] format)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, summary in SUBCOMMANDS.items():
        if only is None or name == only:
            importlib.import_module(f"comfyveil.cli.{name}").register(subparsers)
        else:
            subparsers.add_parser(name, help=summary)
    return parser


def _subcommand(argv: Sequence[str]) -> str:
    """The subcommand named on the command line ("" when none): the first word that is
    neither an option nor the value of --log-format (the one top-level option with one)."""
    words = iter(argv)
    for arg in words:
        if arg == "--log-format":
            next(words, None)
        elif not arg.startswith("-"):
            return arg
    return ""


def _configure_logging(verbosity: int, fmt: str | None = None) -> None:
    level = logging.WARNING if verbosity == 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logs.configure(level, fmt)


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(only=_subcommand(argv))
    args = parser.parse_args(argv)
    _configure_logging(args.verbose, args.log_format)
    try:
        code = asyncio.run(args.handler(args))
    except BrokenPipeError:
        # The reader left early (`comfyveil jobs show ID | head`): nothing went wrong
        # here. Point stdout at /dev/null so the flush at exit raises nothing either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print("comfyveil: interrupted", file=sys.stderr)
        return 130
    except (UsageError, ConfigError) as exc:
        if args.verbose > 1:
            logging.exception("usage error")
        print(f"comfyveil: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ComfyveilError as exc:
        if args.verbose > 1:
            logging.exception("failure")
        print(f"comfyveil: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
