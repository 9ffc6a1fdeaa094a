"""The `comfyveil` command line: what each invocation loads and lists."""

from __future__ import annotations

import subprocess
import sys

import pytest

from comfyveil import cli

# What `comfyveil run` needs and a quick command must not pay for.
HEAVY = ("telegram", "aiohttp", "psycopg")


def _modules_after(argv: list[str]) -> tuple[set[str], str]:
    code = (
        "import sys\n"
        "from comfyveil.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(' '.join(sorted(m.split('.')[0] for m in sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    *help_lines, modules = done.stdout.strip().splitlines()
    return set(modules.split()), "\n".join(help_lines)


def test_help_lists_every_subcommand_without_loading_the_bot() -> None:
    modules, shown = _modules_after(["--help"])
    for name, summary in cli.SUBCOMMANDS.items():
        assert name in shown
        assert summary.split()[0] in shown
    assert not modules & set(HEAVY)


def test_a_subcommand_loads_only_what_it_needs() -> None:
    modules, shown = _modules_after(["anon", "--help"])
    assert "expose" in shown  # the chosen subcommand's own parser is complete
    assert "telegram" not in modules


def _options(parser: object, name: str) -> list[str]:
    subparsers = parser._subparsers._group_actions[0]  # type: ignore[attr-defined]
    return [action.dest for action in subparsers.choices[name]._actions]


@pytest.mark.parametrize("name", list(cli.SUBCOMMANDS))
def test_each_subcommand_alone_has_the_options_it_has_among_all(name: str) -> None:
    assert _options(cli.build_parser(only=name), name) == _options(cli.build_parser(), name)
    assert len(_options(cli.build_parser(only=name), name)) > 1  # more than --help


def test_output_cut_short_by_a_pipe_ends_quietly() -> None:
    """`comfyveil jobs show ID | head`: the reader leaving early is no error to show."""
    code = (
        "import argparse, sys\n"
        "from comfyveil import cli\n"
        "async def lines(args):\n"
        "    for n in range(100000):\n"
        "        print(f'line {n}')\n"
        "    return 0\n"
        "def parser(only=None):\n"
        "    p = argparse.ArgumentParser()\n"
        "    p.add_argument('-v', dest='verbose', action='count', default=0)\n"
        "    p.add_argument('--log-format', dest='log_format', default=None)\n"
        "    p.set_defaults(handler=lines)\n"
        "    return p\n"
        "cli.build_parser = parser\n"
        "sys.exit(cli.main([]))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"line 0\n"
    proc.stdout.close()  # like `head -1` exiting after its line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) != 0
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_run_help_names_both_front_ends() -> None:
    done = subprocess.run([sys.executable, "-m", "comfyveil", "run", "--help"],
                          capture_output=True, text=True, timeout=60, check=True)
    text = " ".join(done.stdout.split())
    assert "Telegram bot" in text and "web front end" in text
