#!/usr/bin/env python3
"""Apply each deliberate bug of tests/mutants.toml to a copy of the tree and run its tests.

A mutant is one small text substitution in one file, with the tests that should notice
it. Each is tried alone, in a temporary copy of the tree (the working tree is never
touched): the mutant is "killed" when its tests fail, and "survived" when they all
pass, which means the suite would not notice that bug. The named tests first run once
on an unchanged copy; a mutant only counts when its tests passed there.

    scripts/mutants.py                 # every mutant
    scripts/mutants.py -k lease seed   # those whose name contains one of the words
    scripts/mutants.py --list

Exit status: 0 when every mutant was killed, 1 when one survived, 2 when the list is
broken (a text that is not in its file, tests failing without any mutant).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LIST = ROOT / "tests" / "mutants.toml"


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    count: int = 1  # how many times `find` occurs in the file; all are replaced
    why: str = ""


@dataclasses.dataclass
class Outcome:
    mutant: Mutant
    verdict: str  # killed, survived, broken
    seconds: float
    detail: str = ""


def load(path: Path) -> list[Mutant]:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    mutants = []
    for entry in data.get("mutant", []):
        tests = entry["tests"]
        mutants.append(
            Mutant(
                name=entry["name"],
                file=entry["file"],
                find=entry["find"],
                replace=entry["replace"],
                tests=tuple([tests] if isinstance(tests, str) else tests),
                count=int(entry.get("count", 1)),
                why=entry.get("why", ""),
            )
        )
    names = [m.name for m in mutants]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise SystemExit(f"{path}: mutant names used twice: {', '.join(sorted(duplicates))}")
    return mutants


def tree_files(root: Path) -> list[str]:
    """Tracked files and untracked ones git does not ignore: what a commit would hold."""
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return [name for name in out.split("\0") if name and (root / name).is_file()]


def copy_tree(root: Path, dest: Path) -> None:
    for name in tree_files(root):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target)


def apply(mutant: Mutant, tree: Path) -> str | None:
    """Make the substitution in `tree`; a reason when it cannot be made as written."""
    path = tree / mutant.file
    if not path.is_file():
        return f"no file {mutant.file}"
    text = path.read_text(encoding="utf-8")
    found = text.count(mutant.find)
    if found != mutant.count:
        return f"the text occurs {found} times in {mutant.file}, expected {mutant.count}"
    path.write_text(text.replace(mutant.find, mutant.replace), encoding="utf-8")
    return None


def pytest_command(tree: Path, tests: tuple[str, ...], extra: list[str]) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-x",
        "-p",
        "no:cacheprovider",
        "--no-header",
        *extra,
        *tests,
    ]
    wrapper = tree / "scripts" / "loopback-only"
    return [str(wrapper), *command] if wrapper.is_file() else command


def run_tests(
    tree: Path, tests: tuple[str, ...], extra: list[str], timeout: float
) -> tuple[int | None, str]:
    """pytest's exit status (None on a timeout) and the tail of its output."""
    env = dict(os.environ)
    # The copy's code, not whatever the virtual environment has installed.
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "src"), str(tree)])
    env.pop("PYTEST_ADDOPTS", None)
    try:
        done = subprocess.run(
            pytest_command(tree, tests, extra),
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return done.returncode, "\n".join(lines[-15:])


def verdict(code: int | None) -> str:
    """Only failing tests kill a mutant; a collection error or no tests says the list is
    wrong (a mutant that breaks the import would otherwise count as caught)."""
    if code is None:
        return "killed (timeout)"
    return {0: "survived", 1: "killed"}.get(code, f"broken (pytest {code})")


def check_imports_copy(tree: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree / "src"), str(tree)]))
    where = subprocess.run(
        [sys.executable, "-c", "import comfyveil; print(comfyveil.__file__)"],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not Path(where).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"the tests would import comfyveil from {where}, not the copy")


def table(outcomes: list[Outcome]) -> str:
    rows = [("mutant", "file", "verdict", "seconds")]
    rows += [(o.mutant.name, o.mutant.file, o.verdict, f"{o.seconds:.0f}") for o in outcomes]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for i, row in enumerate(rows):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
        if i == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", nargs="*", default=[], help="only mutants whose name has a word")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("--file", type=Path, default=DEFAULT_LIST, help="the mutant list")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per test run")
    parser.add_argument(
        "-j", "--jobs", type=int, default=3, help="mutants tried at once (default 3)"
    )
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip running the tests on the unchanged tree first",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show the test output of killed mutants too",
    )
    args = parser.parse_args(argv)

    mutants = load(args.file)
    if args.k:
        mutants = [m for m in mutants if any(word in m.name for word in args.k)]
    if args.list:
        for m in mutants:
            print(f"{m.name:32} {m.file}\n{'':32} {m.why}")
        return 0
    if not mutants:
        print("no mutants selected", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory(prefix="comfyveil-mutants-") as tmp:
        pristine = Path(tmp) / "pristine"
        copy_tree(ROOT, pristine)
        check_imports_copy(pristine)
        if not args.no_baseline:
            tests = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
            print(f"baseline: {len(tests)} test targets on the unchanged tree ...", flush=True)
            extra = ["-n", str(args.jobs)] if args.jobs > 1 else []
            code, output = run_tests(pristine, tests, extra, args.timeout * 2)
            if code != 0:
                print(output)
                print("the named tests fail without any mutant; fix that first", file=sys.stderr)
                return 2

        def attempt(index: int, mutant: Mutant) -> Outcome:
            tree = Path(tmp) / f"mutant-{index}"
            shutil.copytree(pristine, tree, symlinks=True)
            started = time.monotonic()
            try:
                problem = apply(mutant, tree)
                if problem is not None:
                    return Outcome(mutant, "broken (stale)", 0.0, problem)
                code, output = run_tests(tree, mutant.tests, [], args.timeout)
                return Outcome(mutant, verdict(code), time.monotonic() - started, output)
            finally:
                shutil.rmtree(tree, ignore_errors=True)

        # Several mutants at once, each in its own copy: their tests mostly wait.
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
            futures = [pool.submit(attempt, i, m) for i, m in enumerate(mutants)]
            for future in concurrent.futures.as_completed(futures):
                last = future.result()
                print(f"{last.verdict:16} {last.mutant.name} ({last.seconds:.0f} s)", flush=True)
                if args.verbose or not last.verdict.startswith("killed"):
                    print("    " + last.detail.replace("\n", "\n    "), flush=True)
            outcomes = [f.result() for f in futures]

    print()
    print(table(outcomes))
    broken = [o for o in outcomes if o.verdict.startswith("broken")]
    for o in broken:
        print(f"broken: {o.mutant.name}: {o.detail.splitlines()[-1]}", file=sys.stderr)
    survived = [o.mutant.name for o in outcomes if o.verdict == "survived"]
    killed = sum(1 for o in outcomes if o.verdict.startswith("killed"))
    print(f"\n{killed} killed, {len(survived)} survived of {len(outcomes)}")
    if broken:
        return 2
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
