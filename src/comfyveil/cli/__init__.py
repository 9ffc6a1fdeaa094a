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
import sys
from collections.abc import Sequence

from comfyveil import __version__
from comfyveil.errors import ComfyveilError, ConfigError, UsageError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

# Subcommand modules, in the order `comfyveil --help` lists them.
SUBCOMMANDS = (
    "run", "generate", "submit", "jobs", "worker", "workflows", "bench", "anon", "db",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="comfyveil",
        description="Private, self-hosted chat front end for ComfyUI.",
    )
    parser.add_argument("--version", action="version", version=f"comfyveil {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0,
        help="more log output; -vv also prints tracebacks",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(f"comfyveil.cli.{name}").register(subparsers)
    return parser


def _configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity == 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    try:
        code = asyncio.run(args.handler(args))
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
