"""A workflow: an API-format graph and the parameters bound into it; validating a user's
values, applying them to a fresh copy of the graph, hashing it, checking a backend."""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import os
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from comfyveil.comfy.manifest import ModelFile
from comfyveil.comfy.params import SEED_MAX, Param, ParamError, clip, translated
from comfyveil.comfy.requirements import (
    FOLDER_ALIASES,
    combo_options,
    graph_problems,
    input_spec,
    is_link,
    model_folder,
    sorted_ids,
)
from comfyveil.i18n import _, ltr

__all__ = ["SEED_INPUTS", "Workflow"]

# The inputs through which ComfyUI's samplers take their noise seed: KSampler's `seed`,
# KSamplerAdvanced's, SamplerCustom's and RandomNoise's `noise_seed`.
SEED_INPUTS = frozenset({"seed", "noise_seed"})


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
    spoiler: bool = False  # results go behind a spoiler (blurred until tapped)
    # Translations of the title and description by language code ("fa", "zh-hans").
    titles: Mapping[str, str] = field(default_factory=dict)
    descriptions: Mapping[str, str] = field(default_factory=dict)
    # Where its model files come from ([[models]]); not hashed: pinning a file's source
    # does not change what the workflow does.
    models: tuple[ModelFile, ...] = ()
    _lookup: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __hash__(self) -> int:
        return hash((self.name, self.hash))

    @functools.cached_property
    def hash(self) -> str:
        """sha256 (hex) of the canonical graph and bindings; equal content, equal hash."""
        document = {
            "graph": thaw(self.graph),
            "command": self.command,
            "title": self.title,
            "description": self.description,
            "kind": self.kind,
            "params": {name: p.to_dict() for name, p in sorted(self.params.items())},
        }
        # Only when set, so workflows without them keep the hash they always had.
        if self.spoiler:
            document["spoiler"] = True
        if self.titles:
            document["titles"] = dict(self.titles)
        if self.descriptions:
            document["descriptions"] = dict(self.descriptions)
        text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()

    def title_in(self, language: str | None) -> str:
        """The title in `language` ("fa", "pt-br" falls back to "pt"), else the default."""
        return translated(self.titles, language) or self.title

    def description_in(self, language: str | None) -> str:
        return translated(self.descriptions, language) or self.description

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

    @functools.cached_property
    def seed_params(self) -> tuple[str, ...]:
        """Names of the parameters that set a sampler's seed: those of type ``seed``, and
        an ``int`` bound to a seed input (``seed``, ``noise_seed``) or to a node whose
        output feeds one (a primitive holding the seed). A run that is not given one draws
        it afresh, whatever its default: the same seed would make ComfyUI answer the same
        image from its cache."""
        feeders = self._seed_feeders()
        names = []
        for name, p in self.params.items():
            if p.type == "seed" or (
                p.type == "int"
                and any(t.input in SEED_INPUTS or t.node in feeders for t in p.targets)
            ):
                names.append(name)
        return tuple(names)

    def fixed_seeds(self) -> list[tuple[str, str, str]]:
        """(node id, class type, input) of each sampler seed that adds noise and that no
        parameter sets: its value never changes from run to run."""
        bound = {(t.node, t.input) for p in self.params.values() for t in p.targets}
        bound_nodes = {node for node, _input in bound}
        fixed = []
        for node_id in sorted_ids(self.graph):
            node = self.graph[node_id]
            inputs = node.get("inputs") or {}
            if inputs.get("add_noise") in ("disable", False):
                continue  # a sampler that adds no noise: its seed does not matter
            for input_name in sorted(SEED_INPUTS & set(inputs)):
                value = inputs[input_name]
                if is_link(value):
                    reached = str(value[0]) in bound_nodes
                else:
                    reached = (node_id, input_name) in bound
                if not reached:
                    fixed.append((node_id, str(node.get("class_type")), input_name))
        return fixed

    def _seed_feeders(self) -> frozenset[str]:
        """Ids of the nodes whose output is linked into a seed input."""
        feeders = set()
        for node in self.graph.values():
            for input_name, value in (node.get("inputs") or {}).items():
                if input_name in SEED_INPUTS and is_link(value):
                    feeders.add(str(value[0]))
        return frozenset(feeders)

    def without_seeds(self, values: Mapping[str, object]) -> dict[str, object]:
        """`values` less every seed: what running a job again with a new seed takes."""
        seeds = set(self.seed_params)
        return {k: v for k, v in values.items() if k not in seeds}

    def param(self, name_or_alias: str) -> Param:
        """The parameter called `name_or_alias` (a name or an alias).

        Raises:
            ParamError: no such option; the message lists the options.
        """
        name = self._lookup.get(name_or_alias)
        if name is None:
            options = ", ".join(sorted(self.params)) or "-"
            raise ParamError(
                _("unknown option {option}; options: {options}").format(
                    option=ltr(f"--{clip(name_or_alias, 40)}"), options=ltr(options)
                ),
                param=name_or_alias,
            )
        return self.params[name]

    def validate(
        self,
        values: Mapping[str, object],
        *,
        rng: random.Random | None = None,
        max_text: int | None = None,
    ) -> dict[str, object]:
        """Check and complete a user's values; the result is what `apply` takes.

        Strings are coerced (``--set steps=4`` arrives as ``"4"``), bounds are checked,
        defaults filled in, and a seed drawn for each seed parameter not given (see
        `seed_params`; its default, if any, is never used). Values of
        ``None`` count as not given. Image values pass through unchanged. `max_text`
        bounds every text value too (the operator's ``[limits] max_prompt_length``), with
        the same sentence as a workflow's own ``max_length``, whichever is lower.

        Raises:
            ParamError: an unknown option, a missing required one, or a bad value.
        """
        given: dict[str, object] = {}
        for key, value in values.items():
            name = self.param(key).name
            if name in given:
                raise ParamError(_("{name} is given twice").format(name=ltr(name)), param=name)
            if value is not None:
                given[name] = value
        draw = rng if rng is not None else random.Random()
        seeds = self.seed_params
        result: dict[str, object] = {}
        for name, p in self.params.items():
            if name in given:
                if (
                    p.type == "text"
                    and max_text is not None
                    and (p.max_length is None or p.max_length > max_text)
                ):
                    p = dataclasses.replace(p, max_length=max_text)
                result[name] = p.convert(given[name])
            elif name in seeds:
                # Drawn even when a default is declared: the same seed would repeat the
                # last image, and ComfyUI would answer it from its cache.
                low = int(p.min) if p.min is not None else 0
                high = int(p.max) if p.max is not None else SEED_MAX
                result[name] = draw.randint(low, high)
            elif p.default is not None:
                result[name] = p.default
            elif p.required:
                if p.description:
                    text = _("{name} is required: {hint}").format(
                        name=ltr(name), hint=p.described()
                    )
                else:
                    text = _("{name} is required").format(name=ltr(name))
                raise ParamError(text, param=name)
        return result

    def apply(self, values: Mapping[str, object]) -> dict[str, Any]:
        """A fresh copy of the graph with every bound input set to its value.

        `values` should come from `validate`; parameters left out keep the graph's value.
        Image parameters receive the uploaded file's name. The template is never changed.

        Raises:
            ParamError: a name that is not an option.
        """
        graph: dict[str, Any] = thaw(self.graph)
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

    def loader_nodes(self) -> frozenset[str]:
        """Ids of the nodes that load a model file (their cached output is the model)."""
        return frozenset(node_id for node_id, _input, _folder, _file in self._model_refs())

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
            spec = input_spec(info, input_name) if isinstance(info, Mapping) else None
            options = combo_options(spec) if spec is not None else None
            if options is not None:
                known = True
                installed = filename in options
            if models is not None:
                for alias in FOLDER_ALIASES.get(folder, (folder,)):
                    if alias in models:
                        known = True
                        installed = installed or filename in models[alias]
            if known and not installed:
                problems.setdefault(f"model file {filename} ({folder}) is not installed")
        for kind, message in graph_problems(self.graph, object_info):
            if kind != "class":
                problems.setdefault(message)
        return list(problems)

    def _model_refs(self) -> Iterator[tuple[str, str, str, str]]:
        for node_id in sorted_ids(self.graph):
            node = self.graph[node_id]
            class_type = node.get("class_type", "")
            for input_name, value in node.get("inputs", {}).items():
                folder = model_folder(class_type, input_name, value)
                if folder is not None:
                    yield node_id, input_name, folder, value


def freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(v) for v in value]
    return value
