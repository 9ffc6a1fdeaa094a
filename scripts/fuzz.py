"""A long fuzzing campaign (`make fuzz`): every target of tests/fuzz for many inputs.

The parsers that are pure functions run here, in-process, each for its share of the
inputs with a deadline per input and a cap on the address space (a decompression bomb or
a runaway parser fails as MemoryError instead of taking the machine). The HTTP front doors
(the images API's bodies, a command's web form) need the server and PostgreSQL, so they
run as their pytest tests with a larger count (FUZZ_HTTP_COUNT).

Prints a table per target and, as its last line, one JSON object with the figures.
Exit status 1 when any target found a failure (its input is printed, shrunk).

    python scripts/fuzz.py                 # a million inputs in all
    python scripts/fuzz.py --total 20000   # a quick look
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import resource
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from tests.fuzz import targets  # noqa: E402

HTTP_TESTS = "tests/fuzz/test_fuzz_http.py"
HTTP_TARGETS = 2  # the API's bodies and the web form, one test each
MEMORY_LIMIT = 4 * 1024**3


def run_target(target: targets.Target, count: int, run_seed: int, deadline_s: float) -> dict:
    done = 0

    @seed(run_seed)
    @settings(max_examples=count, database=None, deadline=dt.timedelta(seconds=deadline_s),
              suppress_health_check=list(HealthCheck),
              phases=[Phase.generate, Phase.shrink])
    @given(target.inputs)
    def check(value: object) -> None:
        nonlocal done
        done += 1
        target.check(value)

    started = time.monotonic()
    failure = None
    try:
        check()
    except BaseException as exc:  # every failure is reported, none raised
        if isinstance(exc, KeyboardInterrupt):
            raise
        failure = "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]
    return {"target": target.name, "inputs": done, "seconds": round(time.monotonic() - started, 1),
            "failures": 0 if failure is None else 1, "failure": failure}


def _unlimited() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))


def run_http(count: int) -> list[dict]:
    env = {**os.environ, "FUZZ_HTTP_COUNT": str(count)}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", HTTP_TESTS],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
        preexec_fn=_unlimited,  # the server and PostgreSQL map more than a parser may
    )
    seconds = round(time.monotonic() - started, 1)
    tail = result.stdout[-2000:]
    api_failed = "FAILED tests/fuzz/test_fuzz_http.py::test_the_images_api" in result.stdout
    form_failed = "FAILED tests/fuzz/test_fuzz_http.py::test_a_commands_web_form" in result.stdout
    if result.returncode != 0 and not (api_failed or form_failed):
        api_failed = form_failed = True  # the run itself broke: neither is known good
    # each test sends `count` inputs (the API test also `count // 3` multipart edits)
    return [
        {"target": "api-bodies", "inputs": count + count // 3, "seconds": seconds,
         "failures": int(api_failed), "failure": tail if api_failed else None},
        {"target": "web-form", "inputs": count, "seconds": seconds,
         "failures": int(form_failed), "failure": tail if form_failed else None},
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total", type=int, default=1_000_000, help="inputs in all")
    parser.add_argument("--http-share", type=float, default=0.005,
                        help="share of the inputs sent over HTTP (slow: a request each)")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--deadline", type=float, default=5.0, help="seconds per input")
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, hard))
    # The parsers' own warnings (an update skipped, ...) would be a line per input.
    logging.disable(logging.WARNING)

    http_each = int(args.total * args.http_share / (HTTP_TARGETS + 1 / 3) + 0.5)
    pure_each = (args.total - int(http_each * (HTTP_TARGETS + 1 / 3))) // len(targets.PURE_TARGETS)
    rows = []
    for target in targets.PURE_TARGETS:
        row = run_target(target, pure_each, args.seed, args.deadline)
        rows.append(row)
        print(f"{row['target']:16} {row['inputs']:>9} inputs {row['seconds']:>8} s "
              f"{'FAILED' if row['failures'] else 'ok'}", flush=True)
    if http_each:
        for row in run_http(http_each):
            rows.append(row)
            print(f"{row['target']:16} {row['inputs']:>9} inputs {row['seconds']:>8} s "
                  f"{'FAILED' if row['failures'] else 'ok'}", flush=True)

    print()
    print(f"{'target':16} {'inputs':>9} {'per s':>8} {'failures':>8}")
    for row in rows:
        rate = row["inputs"] / row["seconds"] if row["seconds"] else 0
        print(f"{row['target']:16} {row['inputs']:>9} {rate:>8.0f} {row['failures']:>8}")
        if row["failure"]:
            print(f"  {row['failure']}")
    total = sum(r["inputs"] for r in rows)
    failures = sum(r["failures"] for r in rows)
    print(f"{'all':16} {total:>9} {'':>8} {failures:>8}  (seed {args.seed})")
    print(json.dumps({"seed": args.seed, "inputs": total, "failures": failures,
                      "targets": {r["target"]: {"inputs": r["inputs"], "seconds": r["seconds"],
                                                "failures": r["failures"]} for r in rows}}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
