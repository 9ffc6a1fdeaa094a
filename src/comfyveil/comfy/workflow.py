"""Workflows as chat commands: an API-format ComfyUI graph plus parameter bindings.

A workflow is two files side by side:

- ``NAME.json``: the ComfyUI prompt in API format (what "Export (API)" saves): an object
  mapping node ids to ``{"class_type": ..., "inputs": {...}}``; a link is ``["node_id", slot]``.
- ``NAME.toml``: the bindings, which turn the graph into a command::

    command = "f"                  # chat command, /f (a-z, 0-9, _; at most 32)
    title = "Flux Schnell"
    description = "Text to image in 4 steps"
    kind = "image"                 # image | video

    [params.prompt]
    node = "41"                    # node id in NAME.json
    input = "clip_l"               # input name of that node
    type = "text"                  # text | int | float | seed | image | choice | bool
    required = true
    max_length = 2000
    description = "what to draw"

    [params.steps]
    node = "31"
    input = "steps"
    type = "int"
    default = 4                    # optional: the graph's own value is the default
    min = 1
    max = 8

    [params.image]                 # an input image: uploaded, then its name set here
    node = "10"
    input = "image"
    type = "image"

Keys of a parameter:

- ``node`` + ``input``, or ``targets = [{node = "6", input = "text"}, ...]`` when one value
  feeds several inputs (Flux's ``clip_l`` and ``t5xxl``, or a step count used by two
  samplers). A target must be a widget input (a literal value, not a link).
- ``type``: ``text``, ``int``, ``float``, ``seed`` (an int drawn at random when not given),
  ``image`` (an input image; the front end uploads it and binds the uploaded name),
  ``choice`` (needs ``choices = [...]``) or ``bool``.
- ``required`` (default false), ``default`` (when left out, the value the graph already holds,
  so the template's settings stay the defaults; seeds are drawn, images have none),
  ``min``/``max``/``step`` for int, float and seed (``step`` counts from ``min``, so
  ``min = 256, step = 16`` means multiples of 16: the front end maps an aspect ratio onto
  ``width``/``height`` with it), ``max_length`` for text, ``choices`` for choice,
  ``description`` (one line of help), ``aliases = ["n"]`` (other names for the option).
- ``free_text = true`` marks the text parameter that receives the free text of a command
  (``/f a red fox``); without one, the text parameter named ``prompt`` does.

Conventional names, which the front end knows: ``prompt``, ``negative``, ``seed``, ``steps``,
``width``, ``height``, ``image``, and for video ``length`` (frames) and ``fps``.

`validate_graph` and `Workflow.check` compare a graph with a backend's ``/object_info``:
node classes, required inputs, widget values and ranges, and link types. Lists of files
(models, uploaded images) differ per install, so `validate_graph` skips them and
`Workflow.check` reports missing model files on their own.

Loading reads small files synchronously; call it at start-up or through
``asyncio.to_thread``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import importlib.resources
import json
import math
import os
import random
import re
import tomllib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from comfyveil.errors import ComfyveilError, UsageError

__all__ = [
    "KINDS",
    "PARAM_TYPES",
    "SEED_MAX",
    "Param",
    "ParamError",
    "Target",
    "Workflow",
    "WorkflowError",
    "find",
    "load",
    "load_dir",
    "loads",
    "shipped",
    "validate_graph",
]

PARAM_TYPES = ("text", "int", "float", "seed", "image", "choice", "bool")
KINDS = ("image", "video")
SEED_MAX = 2**53 - 1  # the largest integer a JSON number keeps exactly everywhere
COMMAND_RE = re.compile(r"^[a-z0-9_]{1,32}$")  # Telegram's rule for bot commands
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")

_TOP_KEYS = frozenset({"command", "title", "description", "kind", "params"})
_PARAM_KEYS = frozenset({
    "node", "input", "targets", "type", "required", "default", "min", "max", "step",
    "max_length", "choices", "description", "aliases", "free_text",
})
_NUMERIC_TYPES = ("int", "float", "seed")
_TRUE = frozenset({"true", "yes", "on", "1", "y"})
_FALSE = frozenset({"false", "no", "off", "0", "n"})

# Loader inputs naming a model file, and the models/ folder it lives in.
_MODEL_INPUTS: Mapping[str, str] = MappingProxyType({
    "ckpt_name": "checkpoints",
    "unet_name": "diffusion_models",
    "clip_name": "text_encoders",
    "clip_name1": "text_encoders",
    "clip_name2": "text_encoders",
    "clip_name3": "text_encoders",
    "clip_name4": "text_encoders",
    "vae_name": "vae",
    "lora_name": "loras",
    "control_net_name": "controlnet",
    "style_model_name": "style_models",
    "gligen_name": "gligen",
    "hypernetwork_name": "hypernetworks",
})
# The same input name means another folder in these classes.
_CLASS_MODEL_INPUTS: Mapping[tuple[str, str], str] = MappingProxyType({
    ("CLIPVisionLoader", "clip_name"): "clip_vision",
    ("UpscaleModelLoader", "model_name"): "upscale_models",
    ("PhotoMakerLoader", "photomaker_model_name"): "photomaker",
})
# ComfyUI serves some folders under an older name too.
_FOLDER_ALIASES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "diffusion_models": ("diffusion_models", "unet"),
    "text_encoders": ("text_encoders", "clip"),
})
_MODEL_EXTENSIONS = (".safetensors", ".ckpt", ".pt", ".pth", ".bin", ".gguf", ".sft", ".onnx")
_UPLOAD_FLAGS = ("image_upload", "video_upload", "audio_upload", "upload")


class WorkflowError(ComfyveilError):
    """The workflow is not valid."""


class ParamError(UsageError):
    """An option of the command is not valid."""

    def __init__(self, message: str | None = None, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Target:
    """One node input that a parameter sets."""

    node: str
    input: str


@dataclass(frozen=True)
class Param:
    """A command option bound to one or more node inputs of the graph."""

    name: str
    type: str
    targets: tuple[Target, ...]
    required: bool = False
    default: Any = None
    min: int | float | None = None
    max: int | float | None = None
    max_length: int | None = None
    choices: tuple[Any, ...] | None = None
    description: str = ""
    step: int | float | None = None
    aliases: tuple[str, ...] = ()
    free_text: bool = False

    def convert(self, value: object) -> object:
        """Return `value` coerced to this parameter's type and checked against its bounds.

        Raises:
            ParamError: one plain sentence naming the parameter and the problem.
        """
        if self.type == "text":
            return self._convert_text(value)
        if self.type in ("int", "seed"):
            return self._check_range(self._to_int(value))
        if self.type == "float":
            return self._check_range(self._to_float(value))
        if self.type == "bool":
            return self._to_bool(value)
        if self.type == "choice":
            return self._to_choice(value)
        return self._to_image(value)

    def to_dict(self) -> dict[str, Any]:
        """The binding as plain data (for hashing and storage)."""
        return {
            "name": self.name, "type": self.type,
            "targets": [[t.node, t.input] for t in self.targets],
            "required": self.required, "default": self.default, "min": self.min,
            "max": self.max, "step": self.step, "max_length": self.max_length,
            "choices": list(self.choices) if self.choices is not None else None,
            "description": self.description, "aliases": list(self.aliases),
            "free_text": self.free_text,
        }

    def _fail(self, message: str) -> ParamError:
        return ParamError(message, param=self.name)

    def _convert_text(self, value: object) -> str:
        if not isinstance(value, str):
            raise self._fail(f"{self.name} must be text")
        if self.max_length is not None and len(value) > self.max_length:
            raise self._fail(
                f"{self.name} is too long ({len(value)} characters, at most {self.max_length})"
            )
        if self.required and not value.strip():
            raise self._fail(f"{self.name} must not be empty")
        return value

    def _to_int(self, value: object) -> int:
        if isinstance(value, bool):
            raise self._fail(f"{self.name} must be a whole number")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise self._fail(f"{self.name} must be a whole number (got {_show(value)})")

    def _to_float(self, value: object) -> float:
        number: float | None = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                number = None
        if number is None or not math.isfinite(number):
            raise self._fail(f"{self.name} must be a number (got {_show(value)})")
        return number

    def _check_range(self, number: int | float) -> int | float:
        low = self.min if self.min is not None else (0 if self.type == "seed" else None)
        high = self.max if self.max is not None else (SEED_MAX if self.type == "seed" else None)
        if (low is not None and number < low) or (high is not None and number > high):
            if low is not None and high is not None:
                bounds = f"between {_num(low)} and {_num(high)}"
            elif low is not None:
                bounds = f"at least {_num(low)}"
            else:
                bounds = f"at most {_num(high)}"
            raise self._fail(f"{self.name} must be {bounds} (got {_num(number)})")
        if self.step:
            base = low or 0
            ratio = (number - base) / self.step
            if abs(ratio - round(ratio)) > 1e-9:
                if base % self.step == 0:
                    rule = f"a multiple of {_num(self.step)}"
                else:
                    rule = f"{_num(base)} plus a multiple of {_num(self.step)}"
                raise self._fail(f"{self.name} must be {rule} (got {_num(number)})")
        return number

    def _to_bool(self, value: object) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            word = value.strip().lower()
            if word in _TRUE:
                return True
            if word in _FALSE:
                return False
        raise self._fail(f"{self.name} must be yes or no (got {_show(value)})")

    def _to_choice(self, value: object) -> object:
        for choice in self.choices or ():
            if value == choice or (isinstance(value, str) and value.strip() == str(choice)):
                return choice
        options = ", ".join(str(c) for c in self.choices or ())
        raise self._fail(f"{self.name} must be one of: {options} (got {_show(value)})")

    def _to_image(self, value: object) -> object:
        if isinstance(value, os.PathLike) or (isinstance(value, str) and value.strip()):
            return value
        raise self._fail(f"{self.name} must be an image")


@dataclass(frozen=True)
class Workflow:
    """An API-format graph and the parameters that make it a command."""

    name: str
    command: str
    title: str
    description: str
    kind: str
    graph: Mapping[str, Any]  # deeply read-only; apply() returns a fresh copy
    params: Mapping[str, Param]
    source: Path | None = None
    _lookup: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __hash__(self) -> int:
        return hash((self.name, self.hash))

    @functools.cached_property
    def hash(self) -> str:
        """sha256 (hex) of the canonical graph and bindings; equal content, equal hash."""
        document = {
            "graph": _thaw(self.graph),
            "command": self.command, "title": self.title, "description": self.description,
            "kind": self.kind,
            "params": {name: p.to_dict() for name, p in sorted(self.params.items())},
        }
        text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def image_params(self) -> list[str]:
        """Names of the parameters that take an input image, in binding order."""
        return [name for name, p in self.params.items() if p.type == "image"]

    @property
    def prompt_param(self) -> str | None:
        """The text parameter that receives a command's free text, if any."""
        for name, p in self.params.items():
            if p.free_text:
                return name
        prompt = self.params.get("prompt")
        return "prompt" if prompt is not None and prompt.type == "text" else None

    def param(self, name_or_alias: str) -> Param:
        """The parameter called `name_or_alias` (a name or an alias).

        Raises:
            ParamError: no such option; the message lists the options.
        """
        name = self._lookup.get(name_or_alias)
        if name is None:
            options = ", ".join(sorted(self.params)) or "none"
            raise ParamError(
                f"unknown option --{_clip(name_or_alias, 40)}; options: {options}",
                param=name_or_alias,
            )
        return self.params[name]

    def validate(
        self, values: Mapping[str, object], *, rng: random.Random | None = None
    ) -> dict[str, object]:
        """Check and complete a user's values; the result is what `apply` takes.

        Strings are coerced (``--set steps=4`` arrives as ``"4"``), bounds are checked,
        defaults filled in, and a seed drawn for each seed parameter not given. Values of
        ``None`` count as not given. Image values pass through unchanged.

        Raises:
            ParamError: an unknown option, a missing required one, or a bad value.
        """
        given: dict[str, object] = {}
        for key, value in values.items():
            name = self.param(key).name
            if name in given:
                raise ParamError(f"{name} is given twice", param=name)
            if value is not None:
                given[name] = value
        draw = rng if rng is not None else random.Random()
        result: dict[str, object] = {}
        for name, p in self.params.items():
            if name in given:
                result[name] = p.convert(given[name])
            elif p.default is not None:
                result[name] = p.default
            elif p.type == "seed":
                low = int(p.min) if p.min is not None else 0
                high = int(p.max) if p.max is not None else SEED_MAX
                result[name] = draw.randint(low, high)
            elif p.required:
                hint = f": {p.description}" if p.description else ""
                raise ParamError(f"{name} is required{hint}", param=name)
        return result

    def apply(self, values: Mapping[str, object]) -> dict[str, Any]:
        """A fresh copy of the graph with every bound input set to its value.

        `values` should come from `validate`; parameters left out keep the graph's value.
        Image parameters receive the uploaded file's name. The template is never changed.

        Raises:
            ParamError: a name that is not an option.
        """
        graph: dict[str, Any] = _thaw(self.graph)
        for key, value in values.items():
            p = self.param(key)
            if value is None:
                continue
            if p.type == "image" and isinstance(value, os.PathLike):
                value = os.fspath(value)
            for target in p.targets:
                graph[target.node]["inputs"][target.input] = copy.deepcopy(value)
        return graph

    def required_models(self) -> list[tuple[str, str]]:
        """(folder, file name) of each model file the graph loads, in node order."""
        seen: dict[tuple[str, str], None] = {}
        for _node, _input, folder, filename in self._model_refs():
            seen.setdefault((folder, filename))
        return list(seen)

    def check(
        self, object_info: Mapping[str, Any], models: Mapping[str, Sequence[str]] | None = None
    ) -> list[str]:
        """Plain-words problems a backend has with this workflow; empty when it can run it.

        `object_info` is the backend's ``/object_info``; its file lists are the files it has
        installed. `models` (folder -> file names, from ``/models/{folder}``) is an optional
        extra source of installed files.
        """
        problems: dict[str, None] = {}
        for node in self.graph.values():
            class_type = node.get("class_type")
            if class_type not in object_info:
                problems.setdefault(f"node type {class_type} is not installed")
        for node_id, input_name, folder, filename in self._model_refs():
            known = False
            installed = False
            info = object_info.get(self.graph[node_id]["class_type"])
            spec = _input_spec(info, input_name) if isinstance(info, Mapping) else None
            options = _combo_options(spec) if spec is not None else None
            if options is not None:
                known = True
                installed = filename in options
            if models is not None:
                for alias in _FOLDER_ALIASES.get(folder, (folder,)):
                    if alias in models:
                        known = True
                        installed = installed or filename in models[alias]
            if known and not installed:
                problems.setdefault(f"model file {filename} ({folder}) is not installed")
        for kind, message in _graph_problems(self.graph, object_info):
            if kind != "class":
                problems.setdefault(message)
        return list(problems)

    def _model_refs(self) -> Iterator[tuple[str, str, str, str]]:
        for node_id in _sorted_ids(self.graph):
            node = self.graph[node_id]
            class_type = node.get("class_type", "")
            for input_name, value in node.get("inputs", {}).items():
                folder = _model_folder(class_type, input_name, value)
                if folder is not None:
                    yield node_id, input_name, folder, value


# --- loading -------------------------------------------------------------------------------


def loads(
    name: str, toml_text: str, graph_json_text: str, *, source: Path | None = None
) -> Workflow:
    """Build a workflow from the texts of NAME.toml and NAME.json.

    Raises:
        WorkflowError: either text is malformed, or a binding does not fit the graph; the
            message names the file and the problem.
    """
    where = str(source) if source is not None else f"{name}.toml"
    json_where = str(source.with_suffix(".json")) if source is not None else f"{name}.json"
    try:
        bindings = tomllib.loads(toml_text)
    except tomllib.TOMLDecodeError as exc:
        raise WorkflowError(f"{where} is not valid TOML: {exc}") from exc
    try:
        raw_graph = json.loads(graph_json_text)
    except json.JSONDecodeError as exc:
        raise WorkflowError(f"{json_where} is not valid JSON: {exc}") from exc
    graph = _check_graph_shape(raw_graph, json_where)

    unknown = sorted(set(bindings) - _TOP_KEYS)
    if unknown:
        raise WorkflowError(f"{where}: unknown key {unknown[0]}; allowed: {_list(_TOP_KEYS)}")
    command = _get(bindings, "command", str, where, required=True)
    if not COMMAND_RE.match(command):
        raise WorkflowError(
            f"{where}: command {command!r} must be 1 to 32 lowercase letters, digits or _"
        )
    kind = _get(bindings, "kind", str, where) or "image"
    if kind not in KINDS:
        raise WorkflowError(f"{where}: kind must be one of {', '.join(KINDS)} (got {kind!r})")
    title = _get(bindings, "title", str, where) or name
    description = _get(bindings, "description", str, where) or ""
    raw_params = _get(bindings, "params", dict, where) or {}

    params: dict[str, Param] = {}
    lookup: dict[str, str] = {}
    for param_name, table in raw_params.items():
        param = _parse_param(param_name, table, graph, f"{where}: params.{param_name}")
        for key in (param.name, *param.aliases):
            if key in lookup:
                raise WorkflowError(
                    f"{where}: params.{param_name}: the name {key} is already used by "
                    f"params.{lookup[key]}"
                )
            lookup[key] = param.name
        params[param.name] = param
    free = [p.name for p in params.values() if p.free_text]
    if len(free) > 1:
        raise WorkflowError(f"{where}: only one parameter may have free_text (got {free})")

    return Workflow(
        name=name, command=command, title=title, description=description, kind=kind,
        graph=_freeze(graph), params=MappingProxyType(params), source=source,
        _lookup=MappingProxyType(lookup),
    )


def load(toml_path: Path) -> Workflow:
    """Load NAME.toml and the NAME.json beside it.

    Raises:
        WorkflowError: a file is missing, unreadable or not valid.
    """
    toml_path = Path(toml_path)
    json_path = toml_path.with_suffix(".json")
    try:
        toml_text = toml_path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkflowError(f"cannot read workflow file {toml_path}: {exc.strerror}") from exc
    try:
        graph_text = json_path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkflowError(
            f"cannot read {json_path}, the graph of {toml_path.name}: {exc.strerror}"
        ) from exc
    return loads(toml_path.stem, toml_text, graph_text, source=toml_path)


def load_dir(directory: Path) -> dict[str, Workflow]:
    """Every workflow (NAME.toml + NAME.json) in `directory`, keyed by name.

    Raises:
        WorkflowError: one of them is not valid, or the folder cannot be read.
    """
    directory = Path(directory)
    try:
        tomls = sorted(directory.glob("*.toml"))
    except OSError as exc:
        raise WorkflowError(f"cannot read workflow folder {directory}: {exc.strerror}") from exc
    return {path.stem: load(path) for path in tomls}


@functools.cache
def _shipped() -> tuple[Workflow, ...]:
    root = importlib.resources.files("comfyveil.workflows")
    found = []
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            stem = entry.name[: -len(".toml")]
            graph = root.joinpath(f"{stem}.json").read_text(encoding="utf-8")
            found.append(loads(stem, entry.read_text(encoding="utf-8"), graph,
                               source=Path(str(entry))))
    return tuple(found)


def shipped() -> dict[str, Workflow]:
    """The workflows that come with comfyveil, keyed by name."""
    return {w.name: w for w in _shipped()}


def find(name_or_path: str | Path, extra_dirs: Iterable[Path] = ()) -> Workflow:
    """A workflow by name (``flux_schnell_full_text_to_image``), command (``f`` or ``/f``)
    or path to NAME.toml. Workflows in `extra_dirs` take precedence over shipped ones.

    Raises:
        WorkflowError: nothing matches (the message lists what exists), or the file is bad.
    """
    text = os.fspath(name_or_path)
    looks_like_command = COMMAND_RE.match(text.removeprefix("/")) is not None
    if isinstance(name_or_path, Path) or text.endswith(".toml") or (
        os.sep in text and not looks_like_command
    ):
        path = Path(text)
        if not path.is_file():
            raise WorkflowError(f"no workflow file {path}")
        return load(path)
    known = shipped()
    for directory in extra_dirs:
        known.update(load_dir(Path(directory)))
    if text in known:
        return known[text]
    command = text.removeprefix("/")
    for workflow in known.values():
        if workflow.command == command:
            return workflow
    listing = ", ".join(f"{w.command} ({w.name})" for w in
                        sorted(known.values(), key=lambda w: w.command)) or "none"
    raise WorkflowError(f"unknown workflow {_clip(text, 60)}; known: {listing}")


def _check_graph_shape(raw: object, where: str) -> dict[str, Any]:
    if isinstance(raw, dict) and "nodes" in raw and "links" in raw:
        raise WorkflowError(
            f"{where} is a UI-format workflow; save it with Export (API) in ComfyUI"
        )
    if not isinstance(raw, dict) or not raw:
        raise WorkflowError(f"{where} must be an API-format ComfyUI prompt (an object of nodes)")
    for node_id, node in raw.items():
        if not isinstance(node, dict) or not isinstance(node.get("class_type"), str):
            raise WorkflowError(f"{where}: node {node_id} has no class_type")
        if not isinstance(node.get("inputs", {}), dict):
            raise WorkflowError(f"{where}: node {node_id} has inputs that are not an object")
        node.setdefault("inputs", {})
    return raw


def _get(table: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, *,
         required: bool = False) -> Any:
    if key not in table:
        if required:
            raise WorkflowError(f"{where}: {key} is missing")
        return None
    value = table[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
        raise WorkflowError(f"{where}: {key} must be {_type_words(kinds[-1])}")
    return value


def _parse_param(name: str, table: object, graph: Mapping[str, Any], where: str) -> Param:
    if not isinstance(table, dict):
        raise WorkflowError(f"{where} must be a table")
    if not NAME_RE.match(name):
        raise WorkflowError(f"{where}: a parameter name must be lowercase letters, digits or _")
    unknown = sorted(set(table) - _PARAM_KEYS)
    if unknown:
        raise WorkflowError(f"{where}: unknown key {unknown[0]}; allowed: {_list(_PARAM_KEYS)}")
    ptype = _get(table, "type", str, where, required=True)
    if ptype not in PARAM_TYPES:
        raise WorkflowError(
            f"{where}: type must be one of {', '.join(PARAM_TYPES)} (got {ptype!r})"
        )

    targets = _parse_targets(table, where)
    for target in targets:
        node = graph.get(target.node)
        if node is None:
            raise WorkflowError(f"{where}: node {target.node} is not in the graph")
        if target.input not in node["inputs"]:
            raise WorkflowError(
                f"{where}: node {target.node} ({node['class_type']}) has no input {target.input}"
            )
        current = node["inputs"][target.input]
        if _is_link(current):
            raise WorkflowError(
                f"{where}: input {target.input} of node {target.node} is a link to another "
                "node; bind a widget input"
            )
        if not _literal_fits(ptype, current):
            raise WorkflowError(
                f"{where}: a {ptype} parameter cannot set input {target.input} of node "
                f"{target.node}, which holds {_type_words(type(current))}"
            )

    number = (int, float)
    low = _get(table, "min", number, where)
    high = _get(table, "max", number, where)
    step = _get(table, "step", number, where)
    max_length = _get(table, "max_length", int, where)
    choices = _get(table, "choices", list, where)
    aliases = _get(table, "aliases", list, where) or []
    if ptype not in _NUMERIC_TYPES and (low is not None or high is not None or step is not None):
        raise WorkflowError(f"{where}: min, max and step apply to int, float and seed only")
    if low is not None and high is not None and low > high:
        raise WorkflowError(f"{where}: min is greater than max")
    if step is not None and step <= 0:
        raise WorkflowError(f"{where}: step must be greater than 0")
    if max_length is not None and (ptype != "text" or max_length < 1):
        raise WorkflowError(f"{where}: max_length applies to text only and must be at least 1")
    if (choices is not None) != (ptype == "choice") or (choices is not None and not choices):
        raise WorkflowError(f"{where}: a choice parameter needs choices, and only it")
    if not all(isinstance(a, str) and NAME_RE.match(a) for a in aliases):
        raise WorkflowError(f"{where}: aliases must be lowercase names")
    free_text = bool(_get(table, "free_text", bool, where))
    if free_text and ptype != "text":
        raise WorkflowError(f"{where}: only a text parameter can take the free text")
    required = bool(_get(table, "required", bool, where))

    param = Param(
        name=name, type=ptype, targets=targets, required=required, default=None,
        min=low, max=high, max_length=max_length,
        choices=tuple(choices) if choices is not None else None,
        description=_get(table, "description", str, where) or "", step=step,
        aliases=tuple(aliases), free_text=free_text,
    )
    default = table.get("default")
    if default is not None and (required or ptype in ("image",)):
        raise WorkflowError(f"{where}: a required or image parameter has no default")
    if default is None and not required and ptype not in ("seed", "image"):
        values = [graph[t.node]["inputs"][t.input] for t in targets]
        if all(v == values[0] for v in values):
            default = values[0]
    if default is None:
        return param
    try:
        converted = param.convert(default)
    except ParamError as exc:
        origin = "default" if "default" in table else "the graph's value"
        raise WorkflowError(f"{where}: {origin} does not fit: {exc}") from exc
    return dataclasses.replace(param, default=converted)


def _parse_targets(table: Mapping[str, Any], where: str) -> tuple[Target, ...]:
    has_single = "node" in table or "input" in table
    if has_single and "targets" in table:
        raise WorkflowError(f"{where}: use node and input, or targets, not both")
    if has_single:
        node = table.get("node")
        input_name = table.get("input")
        if not isinstance(node, str | int) or isinstance(node, bool) or not isinstance(
            input_name, str
        ):
            raise WorkflowError(f"{where}: needs node (an id) and input (a name)")
        return (Target(str(node), input_name),)
    raw = table.get("targets")
    if not isinstance(raw, list) or not raw:
        raise WorkflowError(f"{where}: needs node and input, or targets")
    targets = []
    for item in raw:
        if (not isinstance(item, dict) or set(item) != {"node", "input"}
                or not isinstance(item["input"], str)):
            raise WorkflowError(f"{where}: each target must be {{node = \"id\", input = \"name\"}}")
        targets.append(Target(str(item["node"]), item["input"]))
    if len(set(targets)) != len(targets):
        raise WorkflowError(f"{where}: a target is listed twice")
    return tuple(targets)


def _literal_fits(ptype: str, value: object) -> bool:
    if ptype in ("int", "seed"):
        return isinstance(value, int | float) and not isinstance(value, bool) and float(
            value
        ).is_integer()
    if ptype == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if ptype in ("text", "image"):
        return isinstance(value, str)
    if ptype == "bool":
        return isinstance(value, bool)
    return isinstance(value, str | int | float)


# --- checking a graph against a backend's /object_info -------------------------------------


def validate_graph(graph: Mapping[str, Any], object_info: Mapping[str, Any]) -> list[str]:
    """Plain-words problems of an API-format graph on a backend; empty when it is valid.

    Checks that every node class exists, every required input is present, every widget
    value has the right type and range (combo values must be listed, except file lists
    such as models and uploaded images, which vary per install), and every link points at
    an existing node's output whose type matches the input.
    """
    return [message for _kind, message in _graph_problems(graph, object_info)]


def _graph_problems(
    graph: Mapping[str, Any], object_info: Mapping[str, Any]
) -> Iterator[tuple[str, str]]:
    for node_id in _sorted_ids(graph):
        node = graph[node_id]
        if not isinstance(node, Mapping) or not isinstance(node.get("class_type"), str):
            yield "shape", f"node {node_id} has no class_type"
            continue
        class_type = node["class_type"]
        info = object_info.get(class_type)
        if not isinstance(info, Mapping):
            yield "class", f"node {node_id}: node type {class_type} is not installed"
            continue
        label = f"node {node_id} ({class_type})"
        inputs = node.get("inputs") or {}
        sections = info.get("input") or {}
        for name in sections.get("required") or {}:
            if name not in inputs:
                yield "input", f"{label} lacks its required input {name}"
        for name, value in inputs.items():
            spec = _input_spec(info, name)
            if spec is None:
                continue  # ComfyUI ignores inputs a node does not declare
            if _is_link(value):
                yield from _link_problems(graph, object_info, label, name, spec, value)
            else:
                problem = _widget_problem(class_type, name, spec, value)
                if problem:
                    yield "value", f"{label} input {name}: {problem}"


def _link_problems(
    graph: Mapping[str, Any], object_info: Mapping[str, Any], label: str, name: str,
    spec: Sequence[Any], link: Sequence[Any],
) -> Iterator[tuple[str, str]]:
    source_id, slot = str(link[0]), int(link[1])
    source = graph.get(source_id)
    if not isinstance(source, Mapping):
        yield "link", f"{label} input {name} is linked to node {source_id}, which does not exist"
        return
    source_info = object_info.get(source.get("class_type"))
    if not isinstance(source_info, Mapping):
        return  # the missing class is reported on its own node
    outputs = source_info.get("output") or []
    source_label = f"node {source_id} ({source['class_type']})"
    if not 0 <= slot < len(outputs):
        yield "link", (
            f"{label} input {name} is linked to output {slot} of {source_label}, "
            f"which has {len(outputs)} output(s)"
        )
        return
    given, wanted = outputs[slot], spec[0]
    if not _types_match(given, wanted):
        yield "link", (
            f"{label} input {name} expects {_type_name(wanted)} but {source_label} "
            f"output {slot} gives {_type_name(given)}"
        )


def _widget_problem(class_type: str, name: str, spec: Sequence[Any], value: object) -> str | None:
    kind = spec[0]
    options = spec[1] if len(spec) > 1 and isinstance(spec[1], Mapping) else {}
    choices = _combo_options(spec)
    if choices is not None:
        if _is_file_input(class_type, name, options, value):
            return None
        if value in choices:
            return None
        shown = ", ".join(str(c) for c in choices[:8]) + (", ..." if len(choices) > 8 else "")
        return f"{_show(value)} is not one of the choices ({shown})"
    if kind == "INT":
        if isinstance(value, bool) or not isinstance(value, int | float) or not float(
            value
        ).is_integer():
            return f"{_show(value)} is not a whole number"
        return _range_problem(value, options)
    if kind == "FLOAT":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{_show(value)} is not a number"
        return _range_problem(value, options)
    if kind == "STRING":
        return None if isinstance(value, str) else f"{_show(value)} is not text"
    if kind == "BOOLEAN":
        return None if isinstance(value, bool) else f"{_show(value)} is not true or false"
    if kind == "*":
        return None
    return f"must be linked to a {_type_name(kind)} output, not set to a value"


def _range_problem(value: float, options: Mapping[str, Any]) -> str | None:
    low, high = options.get("min"), options.get("max")
    if low is not None and value < low:
        return f"{_num(value)} is below the minimum {_num(low)}"
    if high is not None and value > high:
        return f"{_num(value)} is above the maximum {_num(high)}"
    return None


def _types_match(given: object, wanted: object) -> bool:
    given_name, wanted_name = _type_name(given), _type_name(wanted)
    if given_name == wanted_name or "*" in (given_name, wanted_name):
        return True
    given_set = {t.strip() for t in given_name.split(",")}
    wanted_set = {t.strip() for t in wanted_name.split(",")}
    return bool(given_set & wanted_set)


def _type_name(kind: object) -> str:
    return "COMBO" if isinstance(kind, list | tuple) else str(kind)


def _input_spec(info: Mapping[str, Any], name: str) -> Sequence[Any] | None:
    sections = info.get("input") or {}
    for section in ("required", "optional"):
        spec = (sections.get(section) or {}).get(name)
        if spec is not None:
            return spec if isinstance(spec, list | tuple) else [spec]
    return None


def _combo_options(spec: Sequence[Any]) -> list[Any] | None:
    if not spec:
        return None
    if isinstance(spec[0], list | tuple):
        return list(spec[0])
    if spec[0] == "COMBO":
        options = spec[1] if len(spec) > 1 and isinstance(spec[1], Mapping) else {}
        return list(options.get("options") or [])
    return None


def _is_file_input(class_type: str, name: str, options: Mapping[str, Any], value: object) -> bool:
    if any(options.get(flag) for flag in _UPLOAD_FLAGS):
        return True
    return _model_folder(class_type, name, value) is not None


def _model_folder(class_type: str, name: str, value: object) -> str | None:
    if not isinstance(value, str):
        return None
    folder = _CLASS_MODEL_INPUTS.get((class_type, name)) or _MODEL_INPUTS.get(name)
    if folder is not None and "." in value:
        return folder
    if value.lower().endswith(_MODEL_EXTENSIONS):
        return folder or name
    return None


# --- small helpers -------------------------------------------------------------------------


def _is_link(value: object) -> bool:
    return (
        isinstance(value, list | tuple) and len(value) == 2 and isinstance(value[0], str)
        and isinstance(value[1], int) and not isinstance(value[1], bool)
    )


def _sorted_ids(graph: Mapping[str, Any]) -> list[str]:
    return sorted(graph, key=lambda k: (0, int(k), "") if k.isdigit() else (1, 0, k))


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_thaw(v) for v in value]
    return value


def _num(value: float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _show(value: object) -> str:
    return repr(_clip(value, 30)) if isinstance(value, str) else _clip(repr(value), 30)


def _list(names: Iterable[str]) -> str:
    return ", ".join(sorted(names))


def _type_words(kind: type) -> str:
    return {
        str: "text", int: "a whole number", bool: "true or false", dict: "a table",
        list: "a list", float: "a number",
    }.get(kind, kind.__name__)
