"""MkDocs hooks (mkdocs.yml): the configuration reference page is written at build time
from config*.py and the example file, so it cannot drift from what the loader accepts."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

_SPEC = importlib.util.spec_from_file_location(
    "config_reference", Path(__file__).with_name("config_reference.py")
)
assert _SPEC and _SPEC.loader
config_reference = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(config_reference)


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, config_reference.PAGE, content=config_reference.markdown()))
    return files
