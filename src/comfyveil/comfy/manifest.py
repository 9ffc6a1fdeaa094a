"""The model files a workflow needs, pinned: the ``[[models]]`` tables of NAME.toml.

    [[models]]
    repo = "Comfy-Org/flux1-schnell"        # Hugging Face repository id
    path = "flux1-schnell.safetensors"      # path inside the repository
    revision = "f757664c..."                # a commit (40 hex); left out: pinned by sha256 alone
    folder = "diffusion_models"             # ComfyUI models/ subfolder it goes to
    size = 23782506688                      # bytes
    sha256 = "9403429e..."                  # 64 hex
    name = "flux1-schnell.safetensors"      # optional: its name in the folder (path's last part)

The tables say where a file comes from and what its bytes must be; they are not part of
the graph, so the workflow's hash does not change when only they change.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from comfyveil.errors import ComfyveilError

__all__ = ["FOLDERS", "ManifestError", "ModelFile", "parse"]

# ComfyUI's models/ subfolders (folder_paths.py of 0.3.x), the old names included.
FOLDERS = frozenset({
    "checkpoints", "configs", "loras", "vae", "text_encoders", "clip", "diffusion_models",
    "unet", "clip_vision", "style_models", "embeddings", "diffusers", "vae_approx",
    "controlnet", "t2i_adapter", "gligen", "upscale_models", "latent_upscale_models",
    "hypernetworks", "photomaker", "classifiers", "model_patches", "audio_encoders",
})
_KEYS = frozenset({"repo", "path", "revision", "folder", "size", "sha256", "name"})
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class ManifestError(ComfyveilError):
    """A [[models]] table is not valid."""


@dataclass(frozen=True)
class ModelFile:
    """One model file: where it comes from, where it goes, what its bytes must be."""

    repo: str
    path: str  # inside the repository, with / separators
    folder: str  # ComfyUI models/ subfolder
    size: int
    sha256: str
    revision: str | None = None  # a commit; None: the default branch, checked by sha256
    name: str = ""  # file name inside the folder; "" means the last part of path

    @property
    def filename(self) -> str:
        """The name ComfyUI lists it under in its folder (what the graph names)."""
        return self.name or PurePosixPath(self.path).name

    @property
    def relative(self) -> str:
        """``folder/filename``, as it lies under ComfyUI's models/."""
        return f"{self.folder}/{self.filename}"


def parse(raw: object, where: str) -> tuple[ModelFile, ...]:
    """The [[models]] tables of a NAME.toml (`raw` is the parsed value, None when absent).

    Raises:
        ManifestError: a table is malformed; the message names it and the problem.
    """
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ManifestError(f"{where}: models must be a list of tables ([[models]])")
    files: list[ModelFile] = []
    seen: dict[str, int] = {}
    for index, table in enumerate(raw, start=1):
        here = f"{where}: models #{index}"
        model = _parse_one(table, here)
        previous = seen.get(model.relative)
        if previous is not None:
            raise ManifestError(
                f"{here}: {model.relative} is already listed by models #{previous}"
            )
        seen[model.relative] = index
        files.append(model)
    return tuple(files)


def _parse_one(table: object, where: str) -> ModelFile:
    if not isinstance(table, Mapping):
        raise ManifestError(f"{where} must be a table")
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise ManifestError(
            f"{where}: unknown key {unknown[0]}; allowed: {', '.join(sorted(_KEYS))}"
        )
    for key in ("repo", "path", "folder", "size", "sha256"):
        if key not in table:
            raise ManifestError(f"{where}: {key} is missing")
    repo = _text(table, "repo", where)
    if not _REPO_RE.match(repo) or ".." in repo:
        raise ManifestError(f"{where}: repo must be a Hugging Face id such as owner/name")
    path = _relative(_text(table, "path", where), "path", where)
    folder = _text(table, "folder", where)
    if folder not in FOLDERS:
        raise ManifestError(
            f"{where}: folder {folder!r} is not a ComfyUI models folder; one of "
            f"{', '.join(sorted(FOLDERS))}"
        )
    size = table["size"]
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise ManifestError(f"{where}: size must be a whole number of bytes above 0")
    sha256 = _text(table, "sha256", where)
    if not _SHA256_RE.match(sha256):
        raise ManifestError(f"{where}: sha256 must be 64 lowercase hexadecimal digits")
    revision = None
    if "revision" in table:
        revision = _text(table, "revision", where)
        if not _COMMIT_RE.match(revision):
            raise ManifestError(
                f"{where}: revision must be a commit (40 lowercase hexadecimal digits), "
                "never a branch; leave it out to pin the file by sha256 alone"
            )
    name = ""
    if "name" in table:
        name = _relative(_text(table, "name", where), "name", where)
    return ModelFile(
        repo=repo, path=path, folder=folder, size=size, sha256=sha256, revision=revision,
        name=name,
    )


def _text(table: Mapping[str, Any], key: str, where: str) -> str:
    value = table[key]
    if not isinstance(value, str) or not value:
        raise ManifestError(f"{where}: {key} must be text")
    return value


def _relative(value: str, key: str, where: str) -> str:
    """A relative path with / separators that cannot climb out of its folder."""
    parts = value.split("/")
    if (
        value.startswith("/")
        or "\\" in value
        or "\x00" in value
        or any(part in ("", ".", "..") for part in parts)
        or any(ord(c) < 32 for c in value)
    ):
        raise ManifestError(
            f"{where}: {key} must be a relative path without '..', '.', empty parts, "
            "backslashes or control characters"
        )
    return value


def dedupe(groups: Sequence[Sequence[ModelFile]]) -> list[ModelFile]:
    """Every file of several workflows once, in order.

    Raises:
        ManifestError: two workflows want different bytes under the same folder/name.
    """
    chosen: dict[str, ModelFile] = {}
    for files in groups:
        for model in files:
            other = chosen.get(model.relative)
            if other is None:
                chosen[model.relative] = model
            elif other.sha256 != model.sha256:
                raise ManifestError(
                    f"two workflows want different files as {model.relative} "
                    f"(sha256 {other.sha256[:12]}... and {model.sha256[:12]}...)"
                )
    return list(chosen.values())
