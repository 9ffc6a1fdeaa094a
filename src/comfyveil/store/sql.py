"""The named SQL queries of `queries.sql`, split once at import.

Each query in the file starts with a header line `-- name --` followed by a one-line
`-- description`. Code refers to a query by name (`sql.queries["claim_job"]`) and passes
`%(param)s` values as keywords, so no SQL is ever built from strings at run time.
"""

from __future__ import annotations

import re
from importlib import resources
from importlib.resources.abc import Traversable
from typing import LiteralString, cast

_HEADER = re.compile(r"^-- ([a-z_][a-z0-9_]*) --$", re.MULTILINE)


def parse(text: str) -> dict[str, LiteralString]:
    """Split a queries file into {name: query text}."""
    parts = _HEADER.split(text)
    found: dict[str, LiteralString] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in found:
            raise ValueError(f"query {name} is defined twice in queries.sql")
        lines = [line for line in body.strip().splitlines() if line.strip()]
        if lines and lines[0].lstrip().startswith("--"):
            lines = lines[1:]  # the description line
        query = "\n".join(lines).strip().rstrip(";")
        if not query:
            raise ValueError(f"query {name} in queries.sql is empty")
        found[name] = cast(LiteralString, query)
    return found


def _package_files() -> Traversable:
    return resources.files("comfyveil.store")


queries: dict[str, LiteralString] = parse(
    (_package_files() / "queries.sql").read_text(encoding="utf-8")
)


def migrations() -> list[tuple[str, str, LiteralString]]:
    """The shipped migrations as (version, name, sql), sorted by version."""
    found = []
    for entry in (_package_files() / "migrations").iterdir():
        match = re.fullmatch(r"(\d{4})_([a-z0-9_]+)\.sql", entry.name)
        if match:
            text = cast(LiteralString, entry.read_text(encoding="utf-8"))
            found.append((match.group(1), match.group(2), text))
    found.sort()
    versions = [version for version, _, _ in found]
    if len(set(versions)) != len(versions):
        raise ValueError("two migrations share a version number")
    return found
