"""The house's floors: imports go one way. Front ends (telegram/, web/, the images API
in api/) never import each other; the desk they share imports none of them; config
imports no floor above it. Read with `ast`, so a new import that breaks this fails here,
lazy imports inside functions and TYPE_CHECKING blocks included."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import comfyveil

ROOT = Path(comfyveil.__file__).parent
FRONT_ENDS = ("telegram", "web", "api")


@functools.cache  # several tests read the same modules, and parsing them all is a second
def _imports(path: Path, root: Path = ROOT) -> frozenset[str]:
    """Every comfyveil module `path` imports, as dotted names (relative ones resolved)."""
    package = ["comfyveil", *path.relative_to(root).with_suffix("").parts[:-1]]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            names.add(base)
            # `from comfyveil import web` imports the package web
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return frozenset(n for n in names if n == "comfyveil" or n.startswith("comfyveil."))


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _modules(sub: str) -> list[Path]:
    where = ROOT / sub
    return sorted(where.rglob("*.py")) if where.is_dir() else []


def _broken(modules: list[Path], forbidden: set[str]) -> list[str]:
    return sorted(
        f"{path.relative_to(ROOT)} imports {name}"
        for path in modules
        for name in _imports(path)
        if _part(name) in forbidden
    )


def test_the_parser_sees_imports_of_every_form(tmp_path: Path) -> None:
    sample = tmp_path / "telegram" / "probe.py"
    sample.parent.mkdir()
    sample.write_text(
        "from typing import TYPE_CHECKING\n"
        "import comfyveil.web.app\n"
        "from comfyveil import web\n"
        "from ..web import pages\n"
        "def f():\n    from comfyveil.api import server\n"
        "if TYPE_CHECKING:\n    from comfyveil.desk import access\n",
        encoding="utf-8",
    )
    found = _imports(sample, tmp_path)
    assert {
        "comfyveil.web.app",
        "comfyveil.web",
        "comfyveil.web.pages",
        "comfyveil.api.server",
        "comfyveil.desk.access",
    } <= found


def test_front_ends_never_import_each_other() -> None:
    broken: list[str] = []
    for front in FRONT_ENDS:
        broken += _broken(_modules(front), set(FRONT_ENDS) - {front})
    assert broken == []


def test_the_api_is_a_front_end_of_its_own() -> None:
    """The images API reaches the queue through the desk, as the others do; only the
    command line composes it with the web server (cli/ is above every front end)."""
    assert _modules("api"), "the api package is missing"
    assert _broken(_modules("api"), {"telegram", "web", "cli"}) == []
    importers = {
        str(path.relative_to(ROOT))
        for path in ROOT.rglob("*.py")
        if any(_part(name) == "api" for name in _imports(path))
        and _part(f"comfyveil.{path.relative_to(ROOT).parts[0]}") not in ("api", "cli")
    }
    assert importers == set()


def test_the_desk_imports_no_front_end() -> None:
    assert _modules("desk"), "the desk package is missing"
    assert _broken(_modules("desk"), set(FRONT_ENDS) | {"cli"}) == []


def test_config_imports_no_floor_above_it() -> None:
    above = set(FRONT_ENDS) | {"desk", "comfy", "store", "worker", "cli", "anyone"}
    assert _broken([ROOT / "config.py", *ROOT.glob("config_*.py")], above) == []
