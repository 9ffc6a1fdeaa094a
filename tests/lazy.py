"""Heavy libraries imported on first use, not when the test module is collected.

Under xdist every worker collects every test file, so a module-level `import openai`
(0.7 s) is paid eight times a run for the few tests that use it."""

from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    """Stands for module `name` and imports it when a public attribute is first read.
    Private and special names answer AttributeError without importing: pytest looks for
    those on everything a test module holds (fixture markers, `__test__`)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._name), attr)


def lazy_import(name: str) -> Any:
    """`name`, imported when one of its attributes is first read."""
    return LazyModule(name)
