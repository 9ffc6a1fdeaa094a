#!/usr/bin/env python3
"""Run the test suite several times in a row and report every failure with its test id.

A test that fails once in five runs and "passes on the next" is a bug nobody has found
yet; this finds it. Each run is a full pytest run with the arguments given after `--`
(by default those of `make test`); the summary lists, per run, each failing or erroring
test id, then how often each one failed.

    scripts/soak.py                       # 5 runs of the whole suite
    scripts/soak.py --runs 3 -- -n 8 tests/e2e

Exit status: 0 when every run passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ARGS = ["-q", "-p", "no:cacheprovider", "-n", "8"]
# pytest's short summary (-rfE): "FAILED tests/x.py::test_y - AssertionError ..."
FAILURE = re.compile(r"^(FAILED|ERROR) (.+?)(?: - .*)?$")
CLOSING = re.compile(r"^=*\s*(\d+ (passed|failed)|no tests ran).* in [\d.]+s")


def run_once(args: list[str], log: Path) -> tuple[int, list[tuple[str, str]], str, float]:
    """pytest's exit status, its failures (kind, test id), its closing line, its seconds;
    its whole output goes to `log`."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-rfE", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    seconds = time.monotonic() - started
    log.write_text(done.stdout + done.stderr, encoding="utf-8")
    lines = (done.stdout + done.stderr).splitlines()
    failures = [(m.group(1), m.group(2)) for line in lines if (m := FAILURE.match(line))]
    closing = next((line.strip("= ") for line in reversed(lines) if CLOSING.match(line)), "")
    if done.returncode != 0 and not failures:
        # Not a test failing (a collection error, a crash): show the end of the output.
        tail = "\n".join(lines[-20:])
        failures = [("BROKEN", f"pytest exited {done.returncode} without a failing test:\n{tail}")]
    return done.returncode, failures, closing, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="how many runs (default 5)")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments")
    args = parser.parse_args(argv)
    pytest_args = args.pytest_args or DEFAULT_ARGS

    failed_in: dict[str, list[int]] = collections.defaultdict(list)
    green = 0
    logs = Path(tempfile.mkdtemp(prefix="comfyveil-soak-"))
    print(f"each run's whole output: {logs}/run-N.log", flush=True)
    for run in range(1, args.runs + 1):
        code, failures, closing, seconds = run_once(pytest_args, logs / f"run-{run}.log")
        verdict = "green" if code == 0 else "RED"
        green += code == 0
        print(f"run {run}/{args.runs}: {verdict} in {seconds:.0f} s ({closing})", flush=True)
        for kind, test_id in failures:
            print(f"    {kind} {test_id}", flush=True)
            failed_in[test_id].append(run)

    print(f"\nsoak: {green}/{args.runs} runs green")
    for test_id, runs in sorted(failed_in.items()):
        print(f"  failed in run {', '.join(map(str, runs))}: {test_id}")
    return 0 if green == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
