"""Debian's chromium driven by Playwright, for the web tests (JavaScript off).

Playwright's own browser download cannot be reached here, so the tests launch the
system's `chromium` by path and skip, saying why, when it is not installed.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",  # tests run as root in a network namespace; Chromium's sandbox needs neither
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-default-apps",
    "--disable-features=AutofillServerCommunication,OptimizationHints,MediaRouter",
]

try:
    from playwright.async_api import Browser, async_playwright
except ImportError:  # pragma: no cover - the lock file installs it
    async_playwright = None  # type: ignore[assignment]

needs_chromium = pytest.mark.skipif(
    async_playwright is None or not Path(CHROMIUM).exists(),
    reason="Debian's chromium (apt-get install chromium) and the playwright package are "
    "needed for the browser tests; `make test` installs both",
)


@contextlib.asynccontextmanager
async def launch(extra_args: list[str] | None = None) -> AsyncIterator[Browser]:
    assert async_playwright is not None
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM, args=ARGS + (extra_args or []), headless=True
        )
        try:
            yield browser
        finally:
            await browser.close()
