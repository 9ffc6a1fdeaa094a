"""What a ComfyUI folder holds of a workflow's model files, and what installing the rest
needs: each file present, missing, partly downloaded, or present with the wrong size or
hash; the free space per disk; the command line that installs what is missing."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from comfyveil.comfy import bindings
from comfyveil.comfy.manifest import ModelFile
from comfyveil.comfy.requirements import FOLDER_ALIASES
from comfyveil.comfy.template import Workflow
from comfyveil.errors import ComfyveilError, UsageError

__all__ = [
    "FileState",
    "NotEnoughSpace",
    "hash_file",
    "inspect",
    "install_command",
    "install_hint",
    "missing_names",
    "models_dir",
    "partial_path",
    "space_problem",
]

READ_CHUNK = 8 * 1024 * 1024
PARTIAL_SUFFIX = ".comfyveil-partial"

PRESENT = "present"
MISSING = "missing"
WRONG_SIZE = "wrong size"
WRONG_HASH = "wrong hash"


class NotEnoughSpace(ComfyveilError):
    """There is not enough free disk space for the model files."""


@dataclass(frozen=True)
class FileState:
    model: ModelFile
    state: str  # PRESENT, MISSING, WRONG_SIZE or WRONG_HASH
    path: Path  # where it lies (present, wrong) or will lie (missing)
    size: int | None = None  # bytes on disk, when it lies there
    sha256: str | None = None  # when hashed (--verify)
    partial: int = 0  # bytes of an interrupted download waiting to be resumed

    @property
    def ok(self) -> bool:
        return self.state == PRESENT

    @property
    def to_fetch(self) -> int:
        """Bytes an install still has to download for this file."""
        return 0 if self.state != MISSING else max(self.model.size - self.partial, 0)


def models_dir(comfyui_dir: Path) -> Path:
    """ComfyUI's models/ folder inside `comfyui_dir`.

    Raises:
        UsageError: the folder is not a ComfyUI installation (no models/ in it).
    """
    folder = Path(comfyui_dir).expanduser() / "models"
    if not folder.is_dir():
        raise UsageError(
            f"{comfyui_dir} does not look like a ComfyUI folder: it has no models/ folder"
        )
    return folder


def target_path(models: Path, model: ModelFile) -> Path:
    return models / model.folder / model.filename


def partial_path(target: Path, model: ModelFile) -> Path:
    """Where an interrupted download of `model` waits: beside its target, so the final
    rename stays on one disk (a models/ subfolder is often a link to another disk),
    named by its hash so a changed manifest never resumes the wrong bytes, and with an
    extension ComfyUI does not list."""
    return target.with_name(f".{target.name}.{model.sha256[:16]}{PARTIAL_SUFFIX}")


def inspect(
    models: Path, model: ModelFile, *, verify: bool = False,
    on_bytes: Callable[[int], None] | None = None,
) -> FileState:
    """The state of one file under `models` (its folder's older name counts too).

    With `verify`, a file of the right size is hashed (it reads the whole file);
    `on_bytes` is told of each chunk read.
    """
    for alias in FOLDER_ALIASES.get(model.folder, (model.folder,)):
        path = models / alias / model.filename
        try:
            size = path.stat().st_size if path.is_file() else None
        except OSError:
            size = None
        if size is None:
            continue
        if size != model.size:
            return FileState(model, WRONG_SIZE, path, size=size)
        if verify:
            digest = hash_file(path, on_bytes)
            if digest != model.sha256:
                return FileState(model, WRONG_HASH, path, size=size, sha256=digest)
            return FileState(model, PRESENT, path, size=size, sha256=digest)
        return FileState(model, PRESENT, path, size=size)
    target = target_path(models, model)
    partial = partial_path(target, model)
    try:
        done = partial.stat().st_size if partial.is_file() else 0
    except OSError:
        done = 0
    return FileState(model, MISSING, target, partial=min(done, model.size))


def hash_file(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    """SHA-256 (hex) of a file, read in chunks."""
    digest = hashlib.sha256()
    buffer = bytearray(READ_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while True:
            count = handle.readinto(buffer)
            if not count:
                break
            digest.update(view[:count])
            if on_bytes is not None:
                on_bytes(count)
    return digest.hexdigest()


def _existing_ancestor(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def space_problem(states: Iterable[FileState]) -> str | None:
    """One sentence when a disk lacks the space for what is missing, else None.

    Files are grouped by the disk their folder lies on; partly downloaded bytes count
    as already there."""
    needed: dict[int, tuple[Path, int, int]] = {}
    for state in states:
        if state.to_fetch <= 0:
            continue
        where = _existing_ancestor(state.path.parent)
        device = where.stat().st_dev
        _where, total, count = needed.get(device, (where, 0, 0))
        needed[device] = (_where, total + state.to_fetch, count + 1)
    for where, total, count in needed.values():
        free = shutil.disk_usage(where).free
        if free < total:
            files = "1 file" if count == 1 else f"{count} files"
            return (
                f"not enough disk space: {files} need {human_size(total)} in {where}, "
                f"which has {human_size(free)} free; free {human_size(total - free)} "
                "or more, then run this again"
            )
    return None


def human_size(size: int | float) -> str:
    """Bytes in the units `ls -h` and pip use (decimal, GB for 10^9)."""
    value = float(size)
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{int(value)} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def install_command(commands: Sequence[str], comfyui_dir: str | os.PathLike[str] | None = None,
                    *, via_anon: bool = False) -> str:
    """The one command line that installs the files of `commands` (``f``, ``wan``, or a
    NAME.toml path) on a GPU host; `comfyui_dir` unknown (a remote backend): a
    placeholder the operator fills in."""
    words = ["comfyveil", "models", "install", *commands, "--comfyui-dir"]
    line = shlex.join(words)
    line += " " + (shlex.quote(os.fspath(comfyui_dir)) if comfyui_dir is not None else "DIR")
    return line + (" --via-anon" if via_anon else "")


_MISSING_MODEL = re.compile(r"^model file (?P<name>.+) \((?P<folder>[^)]*)\) is not installed$")


def install_hint(wf: Workflow, problems: Sequence[str]) -> str | None:
    """The one command that installs what a backend lacks of `wf`, for admin pages:
    when a problem (`Workflow.check`'s words) is a model file its [[models]] tables
    list; else None. A shipped workflow is named by its command, another by its
    NAME.toml, which the GPU host needs a copy of."""
    listed = {m.filename for m in wf.models}
    if not any((found := _MISSING_MODEL.match(p)) and found["name"] in listed
               for p in problems):
        return None
    shipped = bindings.shipped().get(wf.name)
    word = wf.command if shipped is not None and shipped.hash == wf.hash else (
        f"{wf.name}.toml")
    return install_command([word])


def missing_names(problems: Sequence[str]) -> list[str]:
    """The file names of the model files `Workflow.check`'s problems say are missing."""
    return [found["name"] for p in problems if (found := _MISSING_MODEL.match(p))]
