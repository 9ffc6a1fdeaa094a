"""Shared fixtures: a clean environment and a guard against leaving loopback."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = [
    "tests.fixtures.comfy",
    "tests.fixtures.database",
    "tests.fixtures.anyone",
    "tests.fixtures.telegram",
]

DATA_DIR = Path(__file__).parent / "data"
OBJECT_INFO_FILE = DATA_DIR / "comfyui-0.3.64-object_info.json"

# The kinds of test (README, Tests), each a marker set here from where a test lives and
# what it starts, so `pytest -m KIND` runs one kind:
#   unit         no server, no PostgreSQL, no anon network      tests/unit, tests/anyone
#   integration  a real PostgreSQL and/or fakes, in-process     tests/integration
#   e2e          the product's front doors: the CLI as a subprocess, the bot on the fake
#                Bot API, the web front end over HTTP           tests/e2e, tests/web
#   browser      the web front end in Debian's chromium, JavaScript off
#   anyone       the real anon binary on a private Anyone network on 127.0.0.1
KINDS = ("unit", "integration", "e2e", "browser", "anyone")
TESTS = Path(__file__).parent
ANYONE_FIXTURES = {"anyone_network", "anon_pair"}
BROWSER_FILES = {"test_web_browser.py", "test_web_hidden_service.py"}
POSTGRES_FIXTURES = {"db", "store", "database_url", "empty_database_url", "pg_server"}


def kind_of(item: pytest.Item) -> str:
    fixtures = set(getattr(item, "fixturenames", ()))
    if ANYONE_FIXTURES & fixtures:
        return "anyone"
    if item.path.name in BROWSER_FILES:
        return "browser"
    top = item.path.relative_to(TESTS).parts[0]
    if top in ("e2e", "web"):
        return "e2e"
    if top == "integration" or POSTGRES_FIXTURES & fixtures:
        return "integration"
    return "unit"


def pytest_configure(config: pytest.Config) -> None:
    for kind in KINDS[:-1]:  # `anyone` is declared in pyproject.toml
        config.addinivalue_line("markers", f"{kind}: a test of that kind (tests/conftest.py)")
    # `pytest -n N` alone would spread the groups below over every worker (each starting
    # its own Anyone network); only --dist loadgroup keeps them together.
    if getattr(config.option, "dist", None) == "load":
        config.option.dist = "loadgroup"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        kind = kind_of(item)
        item.add_marker(kind)
        # Tests that must share one pytest-xdist worker (`make test` runs with --dist
        # loadgroup): those on the private Anyone network (a session fixture of ten anon
        # processes, started once, not once per worker) and those in a browser (chromium
        # is the heaviest process the suite starts; side by side they starve the timing
        # of the tests around them).
        if kind in ("anyone", "browser"):
            item.add_marker(pytest.mark.xdist_group(kind))


@pytest.fixture(autouse=True)
def _clean_environ(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test sees the developer's configuration, database or token."""
    import os

    keep = {"COMFYVEIL_ANON_DIR"}  # where `make test` installed the anon binary
    for name in list(os.environ):
        if (name.startswith("COMFYVEIL_") and name not in keep) or name in {
            "DATABASE_URL",
            "ANON_BINARY",
            "TESTS_PG_SERVER_URL",
        }:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COMFYVEIL_DATA_DIR", str(tmp_path / "comfyveil-data"))
    # No test may ever start anon on the public Anyone network (see anyone/network.py).
    monkeypatch.setenv("COMFYVEIL_ANYONE_FORBID_PUBLIC", "1")


_real_connect = socket.socket.connect


def _is_local(address: object) -> bool:
    if isinstance(address, (str, bytes)):  # AF_UNIX
        return True
    host = address[0] if isinstance(address, tuple) else address
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail any test whose process opens a socket to a non-loopback address."""

    def guarded_connect(self: socket.socket, address: object) -> object:
        if not _is_local(address):
            pytest.fail(f"network access outside loopback refused: {address!r}")
        return _real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    yield
