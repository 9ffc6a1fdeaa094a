"""Loading workflows: NAME.toml bindings parsed against the NAME.json graph beside them
(the format is described in `comfy.workflow`), and finding shipped or extra ones by name,
command or path."""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import json
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from comfyveil.comfy import manifest
from comfyveil.comfy.params import PARAM_TYPES, Param, ParamError, Target, clip
from comfyveil.comfy.requirements import is_link
from comfyveil.comfy.template import Workflow, freeze
from comfyveil.errors import ComfyveilError

__all__ = ["KINDS", "WorkflowError", "find", "load", "load_dir", "loads", "shipped"]

KINDS = ("image", "video")
COMMAND_RE = re.compile(r"^[a-z0-9_]{1,32}$")  # Telegram's rule for bot commands
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")

_TOP_KEYS = frozenset(
    {"command", "title", "description", "kind", "params", "spoiler", "models"}
)
_PARAM_KEYS = frozenset(
    {
        "node",
        "input",
        "targets",
        "type",
        "required",
        "default",
        "min",
        "max",
        "step",
        "max_length",
        "choices",
        "description",
        "label",
        "aliases",
        "free_text",
    }
)
_NUMERIC_TYPES = ("int", "float", "seed")


class WorkflowError(ComfyveilError):
    """The workflow is not valid."""


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
    title, titles = _texts(bindings, "title", where)
    title = title or name
    description, descriptions = _texts(bindings, "description", where)
    spoiler = bool(_get(bindings, "spoiler", bool, where))
    raw_params = _get(bindings, "params", dict, where) or {}
    try:
        models = manifest.parse(bindings.get("models"), where)
    except manifest.ManifestError as exc:
        raise WorkflowError(str(exc)) from exc

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
        name=name,
        command=command,
        title=title,
        description=description,
        kind=kind,
        graph=freeze(graph),
        params=MappingProxyType(params),
        source=source,
        spoiler=spoiler,
        titles=MappingProxyType(titles),
        descriptions=MappingProxyType(descriptions),
        models=models,
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
            found.append(
                loads(stem, entry.read_text(encoding="utf-8"), graph, source=Path(str(entry)))
            )
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
    if (
        isinstance(name_or_path, Path)
        or text.endswith(".toml")
        or (os.sep in text and not looks_like_command)
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
    listing = (
        ", ".join(
            f"{w.command} ({w.name})" for w in sorted(known.values(), key=lambda w: w.command)
        )
        or "none"
    )
    raise WorkflowError(f"unknown workflow {clip(text, 60)}; known: {listing}")


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


def _texts(bindings: Mapping[str, Any], key: str, where: str) -> tuple[str, dict[str, str]]:
    """A text and its translations: ``title = "Flux"``, or a table of languages
    (``title.default = "Flux"``, ``title.fa = "..."``; "en" is the default without
    "default")."""
    value = _get(bindings, key, (str, dict), where)
    if value is None or isinstance(value, str):
        return value or "", {}
    texts: dict[str, str] = {}
    for language, text in value.items():
        code = r"default|[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})*"
        if not isinstance(text, str) or not re.fullmatch(code, language):
            raise WorkflowError(
                f"{where}: {key}.{language} must be a text under a language code such as fa"
            )
        texts[language.lower().replace("_", "-")] = text
    default = texts.pop("default", None) or texts.get("en")
    if default is None:
        raise WorkflowError(f"{where}: {key} needs a default text ({key}.default or {key}.en)")
    return default, texts


def _get(
    table: Mapping[str, Any],
    key: str,
    kind: type | tuple[type, ...],
    where: str,
    *,
    required: bool = False,
) -> Any:
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
        if is_link(current):
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

    description, descriptions = _texts(table, "description", where)
    label, labels = _texts(table, "label", where)
    param = Param(
        name=name,
        type=ptype,
        targets=targets,
        required=required,
        default=None,
        min=low,
        max=high,
        max_length=max_length,
        choices=tuple(choices) if choices is not None else None,
        description=description,
        label=label,
        labels=tuple(sorted(labels.items())),
        descriptions=tuple(sorted(descriptions.items())),
        step=step,
        aliases=tuple(aliases),
        free_text=free_text,
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
        if (
            not isinstance(node, str | int)
            or isinstance(node, bool)
            or not isinstance(input_name, str)
        ):
            raise WorkflowError(f"{where}: needs node (an id) and input (a name)")
        return (Target(str(node), input_name),)
    raw = table.get("targets")
    if not isinstance(raw, list) or not raw:
        raise WorkflowError(f"{where}: needs node and input, or targets")
    targets = []
    for item in raw:
        if (
            not isinstance(item, dict)
            or set(item) != {"node", "input"}
            or not isinstance(item["input"], str)
        ):
            raise WorkflowError(f'{where}: each target must be {{node = "id", input = "name"}}')
        targets.append(Target(str(item["node"]), item["input"]))
    if len(set(targets)) != len(targets):
        raise WorkflowError(f"{where}: a target is listed twice")
    return tuple(targets)


def _literal_fits(ptype: str, value: object) -> bool:
    if ptype in ("int", "seed"):
        return (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and float(value).is_integer()
        )
    if ptype == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if ptype in ("text", "image"):
        return isinstance(value, str)
    if ptype == "bool":
        return isinstance(value, bool)
    return isinstance(value, str | int | float)


def _list(names: Iterable[str]) -> str:
    return ", ".join(sorted(names))


def _type_words(kind: type) -> str:
    return {
        str: "text",
        int: "a whole number",
        bool: "true or false",
        dict: "a table",
        list: "a list",
        float: "a number",
    }.get(kind, kind.__name__)
