"""What a graph needs from a backend, read from its ``/object_info``: node classes, required
inputs, widget values and ranges, link types, and the model files it loads.

Lists of files (models, uploaded images) differ per install, so `validate_graph` skips
them; `Workflow.check` reports missing model files on their own."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from comfyveil.comfy.params import num, show

__all__ = ["validate_graph"]

# Loader inputs naming a model file, and the models/ folder it lives in.
_MODEL_INPUTS: Mapping[str, str] = MappingProxyType(
    {
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
    }
)
# The same input name means another folder in these classes.
_CLASS_MODEL_INPUTS: Mapping[tuple[str, str], str] = MappingProxyType(
    {
        ("CLIPVisionLoader", "clip_name"): "clip_vision",
        ("UpscaleModelLoader", "model_name"): "upscale_models",
        ("PhotoMakerLoader", "photomaker_model_name"): "photomaker",
    }
)
# ComfyUI serves some folders under an older name too.
FOLDER_ALIASES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "diffusion_models": ("diffusion_models", "unet"),
        "text_encoders": ("text_encoders", "clip"),
    }
)
_MODEL_EXTENSIONS = (".safetensors", ".ckpt", ".pt", ".pth", ".bin", ".gguf", ".sft", ".onnx")
_UPLOAD_FLAGS = ("image_upload", "video_upload", "audio_upload", "upload")


def validate_graph(graph: Mapping[str, Any], object_info: Mapping[str, Any]) -> list[str]:
    """Plain-words problems of an API-format graph on a backend; empty when it is valid.

    Checks that every node class exists, every required input is present, every widget
    value has the right type and range (combo values must be listed, except file lists
    such as models and uploaded images, which vary per install), and every link points at
    an existing node's output whose type matches the input.
    """
    return [message for _kind, message in graph_problems(graph, object_info)]


def graph_problems(
    graph: Mapping[str, Any], object_info: Mapping[str, Any]
) -> Iterator[tuple[str, str]]:
    for node_id in sorted_ids(graph):
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
            spec = input_spec(info, name)
            if spec is None:
                continue  # ComfyUI ignores inputs a node does not declare
            if is_link(value):
                yield from _link_problems(graph, object_info, label, name, spec, value)
            else:
                problem = _widget_problem(class_type, name, spec, value)
                if problem:
                    yield "value", f"{label} input {name}: {problem}"


def _link_problems(
    graph: Mapping[str, Any],
    object_info: Mapping[str, Any],
    label: str,
    name: str,
    spec: Sequence[Any],
    link: Sequence[Any],
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
        yield (
            "link",
            (
                f"{label} input {name} is linked to output {slot} of {source_label}, "
                f"which has {len(outputs)} output(s)"
            ),
        )
        return
    given, wanted = outputs[slot], spec[0]
    if not _types_match(given, wanted):
        yield (
            "link",
            (
                f"{label} input {name} expects {_type_name(wanted)} but {source_label} "
                f"output {slot} gives {_type_name(given)}"
            ),
        )


def _widget_problem(class_type: str, name: str, spec: Sequence[Any], value: object) -> str | None:
    kind = spec[0]
    options = spec[1] if len(spec) > 1 and isinstance(spec[1], Mapping) else {}
    choices = combo_options(spec)
    if choices is not None:
        if _is_file_input(class_type, name, options, value):
            return None
        if value in choices:
            return None
        shown = ", ".join(str(c) for c in choices[:8]) + (", ..." if len(choices) > 8 else "")
        return f"{show(value)} is not one of the choices ({shown})"
    if kind == "INT":
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not float(value).is_integer()
        ):
            return f"{show(value)} is not a whole number"
        return _range_problem(value, options)
    if kind == "FLOAT":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{show(value)} is not a number"
        return _range_problem(value, options)
    if kind == "STRING":
        return None if isinstance(value, str) else f"{show(value)} is not text"
    if kind == "BOOLEAN":
        return None if isinstance(value, bool) else f"{show(value)} is not true or false"
    if kind == "*":
        return None
    return f"must be linked to a {_type_name(kind)} output, not set to a value"


def _range_problem(value: float, options: Mapping[str, Any]) -> str | None:
    low, high = options.get("min"), options.get("max")
    if low is not None and value < low:
        return f"{num(value)} is below the minimum {num(low)}"
    if high is not None and value > high:
        return f"{num(value)} is above the maximum {num(high)}"
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


def input_spec(info: Mapping[str, Any], name: str) -> Sequence[Any] | None:
    sections = info.get("input") or {}
    for section in ("required", "optional"):
        spec = (sections.get(section) or {}).get(name)
        if spec is not None:
            return spec if isinstance(spec, list | tuple) else [spec]
    return None


def combo_options(spec: Sequence[Any]) -> list[Any] | None:
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
    return model_folder(class_type, name, value) is not None


def model_folder(class_type: str, name: str, value: object) -> str | None:
    if not isinstance(value, str):
        return None
    folder = _CLASS_MODEL_INPUTS.get((class_type, name)) or _MODEL_INPUTS.get(name)
    if folder is not None and "." in value:
        return folder
    if value.lower().endswith(_MODEL_EXTENSIONS):
        return folder or name
    return None


def is_link(value: object) -> bool:
    return (
        isinstance(value, list | tuple)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int)
        and not isinstance(value[1], bool)
    )


def sorted_ids(graph: Mapping[str, Any]) -> list[str]:
    return sorted(graph, key=lambda k: (0, int(k), "") if k.isdigit() else (1, 0, k))
