"""Shared fixtures: a clean environment and a guard against leaving loopback."""

from __future__ import annotations

import gc
import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = [
    "tests.fixtures.memory_tmp",  # first: the other plugins make temporary directories
    "tests.fixtures.comfy",
    "tests.fixtures.database",
    "tests.fixtures.anyone",
    "tests.fixtures.telegram",
]

DATA_DIR = Path(__file__).parent / "data"
OBJECT_INFO_FILE = DATA_DIR / "comfyui-0.3.64-object_info.json"

# The kinds of test (docs/develop/tests.md), each a marker set here from where a test lives and
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
POSTGRES_FIXTURES = {"db", "store", "database_url", "empty_database_url", "pg_server"}
# Files whose tests share one pytest-xdist worker (`make test` runs with -n): those on the
# private Anyone network (a session fixture of ten anon processes, started once, not once
# per worker); those in a browser (chromium is the heaviest process the suite starts;
# side by side they starve the timing of the tests around them); test_i18n (its module
# fixture extracts the catalog template from the whole package, a second of CPU: once,
# not in every worker). By file, not by an xdist_group mark: xdist 3.8's loadgroup loses
# its groups on pytest 9.2 (its issue 1386).
GROUPED_FILES = {
    "tests/anyone/test_anyone_network.py": "anyone",
    "tests/anyone/test_anyone_product.py": "anyone",
    "tests/anyone/test_web_hidden_service.py": "anyone",
    "tests/anyone/test_models_via_anon.py": "anyone",
    "tests/web/test_web_browser.py": "browser",
    "tests/unit/test_i18n.py": "i18n",
}


def kind_of(item: pytest.Item) -> str:
    fixtures = set(getattr(item, "fixturenames", ()))
    path = item.path.relative_to(TESTS)
    if ANYONE_FIXTURES & fixtures:
        return "anyone"
    if GROUPED_FILES.get(f"tests/{path.as_posix()}") == "browser":
        return "browser"
    if path.parts[0] in ("e2e", "web"):
        return "e2e"
    if path.parts[0] == "integration" or POSTGRES_FIXTURES & fixtures:
        return "integration"
    return "unit"


@pytest.hookimpl(trylast=True)  # after TMPDIR is set (tests/fixtures/memory_tmp.py)
def pytest_configure(config: pytest.Config) -> None:
    for kind in KINDS[:-1]:  # `anyone` is declared in pyproject.toml
        config.addinivalue_line("markers", f"{kind}: a test of that kind (tests/conftest.py)")
    if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
        from tests import zygote

        zygote.start_shared()  # one for the run: the workers, started next, share it


def pytest_itemcollected(item: pytest.Item) -> None:
    kind = kind_of(item)
    item.add_marker(kind)
    where = f"tests/{item.path.relative_to(TESTS).as_posix()}"
    if kind == "anyone" and GROUPED_FILES.get(where) != "anyone":
        raise pytest.UsageError(
            f"{item.nodeid} starts the private Anyone network: add {where} to GROUPED_FILES "
            "in tests/conftest.py, or each xdist worker starts a network of its own"
        )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """xdist's load scheduling, with each file of GROUPED_FILES one unit of work."""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupedFiles(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return GROUPED_FILES.get(nodeid.split("::", 1)[0], nodeid)

    return GroupedFiles(config, log)


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


@pytest.fixture
def short_tmp_path() -> Iterator[Path]:
    """A private (0700) temporary directory with a short path, for a test that expects a
    Unix socket (about 100 bytes of path at most) in it: tmp_path's depth depends on
    TMPDIR, the worker and the test's name."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="t-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Collect garbage less often in the test processes. What collection imported is
    moved out of the collector's sight (gc.freeze), and a young generation of 20 000
    objects, not 700, lets the fakes' and clients' short-lived JSON (a parsed
    /object_info is ~8 000 objects the collector tracks: eleven young collections at
    700) die before it is promoted and scanned again.
    Garbage collection took 17 s of four workers' 62 s of CPU on a quarter of the
    suite, and 8-12 s so."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Let go of the test's web apps. aiohttp caches each handler's middleware chain in a
    module-level lru_cache of 1 024 entries, which holds every app a test built (routes,
    state, the fake ComfyUI with its node definitions) for hundreds of tests: a worker's
    heap grew by ~9 500 objects a test, and its full garbage collections took a fifth of
    its CPU. A server runs its few apps for ever; a test run builds hundreds."""
    from aiohttp import web_app

    cached = getattr(web_app, "_cached_build_middleware", None)
    if cached is not None:
        cached.cache_clear()


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
