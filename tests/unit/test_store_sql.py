"""The named queries file and the migrations list (no database needed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from comfyveil.store import sql

STORE_DIR = Path(sql.__file__).parent


def test_parse_splits_named_queries_and_drops_descriptions() -> None:
    text = (
        "-- preamble\n\n-- first --\n-- does one thing\nSELECT 1;\n\n"
        "-- second --\n-- x\nSELECT 2\n"
    )
    assert sql.parse(text) == {"first": "SELECT 1", "second": "SELECT 2"}


def test_parse_refuses_duplicates_and_empty_queries() -> None:
    with pytest.raises(ValueError, match="twice"):
        sql.parse("-- a --\n-- d\nSELECT 1;\n-- a --\n-- d\nSELECT 2;\n")
    with pytest.raises(ValueError, match="empty"):
        sql.parse("-- a --\n-- only a description\n")


def test_every_query_the_code_names_exists() -> None:
    used: set[str] = set()
    for path in STORE_DIR.glob("*.py"):
        used |= set(re.findall(r'\.(?:one|all|run)\(\s*"([a-z_]+)"', path.read_text()))
        used |= set(re.findall(r'_held\(\s*"([a-z_]+)"', path.read_text()))
    assert used, "no query calls found; the pattern above is out of date"
    assert used - set(sql.queries) == set()


def test_migrations_are_numbered_in_order() -> None:
    versions = [version for version, _, _ in sql.migrations()]
    assert versions[0] == "0001"
    assert versions == sorted(versions) == [f"{i:04d}" for i in range(1, len(versions) + 1)]
