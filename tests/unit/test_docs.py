"""The documentation keeps its promises: the configuration reference names every key of
comfyveil.example.toml and no other, the README stays short with its two commands first
and links only to files that exist, and `comfyveil --version` is pyproject's version."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "config_reference", ROOT / "scripts" / "config_reference.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _page_keys(page: str) -> set[tuple[str, str]]:
    """(section, key) for every row of the generated page's tables."""
    keys = set()
    section = ""
    for line in page.splitlines():
        head = re.match(r"## (?:Top level|`\[\[?([^\]]+)\]\]?`)$", line)
        if head:
            section = head.group(1) or "top level"
            continue
        row = re.match(r"\| `([a-z_]+)` \|", line)
        if row:
            keys.add((section, row.group(1)))
    return keys


def test_the_configuration_reference_names_every_key_of_the_example_file_and_no_other() -> None:
    reference = _reference()
    page = _page_keys(reference.markdown())
    example = set(reference.example_keys())
    assert example - page == set(), "in comfyveil.example.toml, missing from the reference"
    assert page - example == set(), "accepted by the loader, missing from the example file"
    # Every key has a sentence: the reference is read instead of the code.
    assert "|  |\n" not in reference.markdown()


def test_the_reference_leaves_out_a_key_the_loader_refuses_and_shows_each_accepted_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The keys come from what the loader (config_load.py) accepts, not from a list of our
    own: a rule for a key the loader does not take is left out, and the example file's key
    is then missing."""
    reference = _reference()
    rules = reference.config_rules.RULES
    monkeypatch.setitem(rules, "worker", {**rules["worker"], "ghost": None})
    assert ("worker", "ghost") not in _page_keys(reference.markdown())
    assert ("worker", "stop_grace") in _page_keys(reference.markdown())


def test_the_example_files_comments_are_read_per_key() -> None:
    found, intros = _reference()._example()
    words = {(s, k): w for s, k, w in found}
    assert words[("worker", "job_timeout")].startswith("seconds a job may take")
    # A comment carried on to the next lines belongs to its key.
    assert "post it at once" in words[("telegram", "status_delay")]
    assert "telegram" in intros and "COMFYVEIL_TELEGRAM_TOKEN" in intros["telegram"]


def test_readme_is_short_and_starts_with_make_run_and_make_test() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150
    commands = [line.split("#")[0].strip() for line in lines if line.startswith("make ")]
    assert commands[:2] == ["make run", "make test"]
    first_block = lines[lines.index("```sh") + 1 : lines.index("```sh") + 3]
    assert [line.split()[0:2] for line in first_block] == [["make", "run"], ["make", "test"]]


def test_readme_links_only_to_files_that_exist() -> None:
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert local, "the README links into the docs"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert missing == []


def test_no_doc_links_outside_the_repository() -> None:
    """A clone has no ../shared: the docs are written for the repository's readers."""
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    outside = [p.name for p in pages if "pending" not in p.parts and "../shared" in p.read_text()]
    assert outside == []


def test_version_matches_pyproject() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    run = subprocess.run(
        [sys.executable, "-m", "comfyveil", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert run.stdout.strip() == f"comfyveil {version}"


def test_changelog_has_an_unreleased_section_and_the_current_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    headings = re.findall(r"^## \[([^\]]+)\]", text, flags=re.MULTILINE)
    assert headings[0] == "Unreleased"
    assert version in headings


def test_docs_and_comments_in_src_give_reasons_not_issue_numbers() -> None:
    """A reader of the repository cannot open "issue 22 §8": the text says the reason."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    files += sorted((ROOT / "src").rglob("*.py"))
    pattern = re.compile(r"\bissue \d+|notes: issue", re.IGNORECASE)
    cited = [
        str(p.relative_to(ROOT))
        for p in files
        if "pending" not in p.parts and pattern.search(p.read_text())
    ]
    assert cited == []


def test_every_benchmark_script_is_on_the_benchmarks_page() -> None:
    page = (ROOT / "docs" / "benchmarks" / "index.md").read_text()
    scripts = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__")
    assert [s for s in scripts if f"| `{s}` |" not in page] == []
