"""The five shipped workflows against a real ComfyUI 0.3.64's node definitions.

Expected model files, samplers and settings are those of the official templates in
comfyui-workflow-templates 0.1.95 (see notes/comfyui-api.md section 11).
"""

from __future__ import annotations

import collections
import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest

from comfyveil.comfy import workflow

OBJECT_INFO_PATH = Path(__file__).parent.parent / "data" / "comfyui-0.3.64-object_info.json"

COMMANDS = {
    "sd3.5_simple_example": "sd3",
    "flux_schnell_full_text_to_image": "f",
    "flux_dev_full_text_to_image": "fd",
    "video_wan2_2_14B_t2v": "wan",
    "image_qwen_image_edit_2509": "qwen",
}

MODELS = {
    "sd3.5_simple_example": {("checkpoints", "sd3.5_large_fp8_scaled.safetensors")},
    "flux_schnell_full_text_to_image": {
        ("diffusion_models", "flux1-schnell.safetensors"),
        ("text_encoders", "clip_l.safetensors"),
        ("text_encoders", "t5xxl_fp16.safetensors"),
        ("vae", "ae.safetensors"),
    },
    "flux_dev_full_text_to_image": {
        ("diffusion_models", "flux1-dev.safetensors"),
        ("text_encoders", "clip_l.safetensors"),
        ("text_encoders", "t5xxl_fp16.safetensors"),
        ("vae", "ae.safetensors"),
    },
    "video_wan2_2_14B_t2v": {
        ("diffusion_models", "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors"),
        ("diffusion_models", "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors"),
        ("loras", "wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors"),
        ("loras", "wan2.2_t2v_lightx2v_4steps_lora_v1.1_low_noise.safetensors"),
        ("text_encoders", "umt5_xxl_fp8_e4m3fn_scaled.safetensors"),
        ("vae", "wan_2.1_vae.safetensors"),
    },
    "image_qwen_image_edit_2509": {
        ("diffusion_models", "qwen_image_edit_2509_fp8_e4m3fn.safetensors"),
        ("loras", "Qwen-Image-Edit-2509-Lightning-4steps-V1.0-bf16.safetensors"),
        ("text_encoders", "qwen_2.5_vl_7b_fp8_scaled.safetensors"),
        ("vae", "qwen_image_vae.safetensors"),
    },
}

# (class_type, count) of the template's active path; notes and bypassed branches dropped.
NODES = {
    "sd3.5_simple_example": {"CheckpointLoaderSimple": 1, "CLIPTextEncode": 2,
                             "EmptySD3LatentImage": 1, "KSampler": 1, "VAEDecode": 1,
                             "SaveImage": 1},
    "flux_schnell_full_text_to_image": {"UNETLoader": 1, "DualCLIPLoader": 1, "VAELoader": 1,
                                        "CLIPTextEncodeFlux": 1, "ConditioningZeroOut": 1,
                                        "EmptySD3LatentImage": 1, "KSampler": 1,
                                        "VAEDecode": 1, "SaveImage": 1},
    "video_wan2_2_14B_t2v": {"UNETLoader": 2, "CLIPLoader": 1, "VAELoader": 1,
                             "LoraLoaderModelOnly": 2, "ModelSamplingSD3": 2,
                             "CLIPTextEncode": 2, "EmptyHunyuanLatentVideo": 1,
                             "KSamplerAdvanced": 2, "VAEDecode": 1, "CreateVideo": 1,
                             "SaveVideo": 1},
    "image_qwen_image_edit_2509": {"UNETLoader": 1, "CLIPLoader": 1, "VAELoader": 1,
                                   "LoraLoaderModelOnly": 1, "ModelSamplingAuraFlow": 1,
                                   "CFGNorm": 1, "LoadImage": 1, "ImageScaleToTotalPixels": 1,
                                   "VAEEncode": 1, "TextEncodeQwenImageEditPlus": 2,
                                   "KSampler": 1, "VAEDecode": 1, "SaveImage": 1},
}
NODES["flux_dev_full_text_to_image"] = NODES["flux_schnell_full_text_to_image"]

# Sampler settings of the templates: (steps, cfg, sampler_name, scheduler) per sampler node.
SAMPLERS = {
    "sd3.5_simple_example": [(20, 4.01, "euler", "sgm_uniform")],
    "flux_schnell_full_text_to_image": [(4, 1, "euler", "simple")],
    "flux_dev_full_text_to_image": [(20, 1, "euler", "simple")],
    "video_wan2_2_14B_t2v": [(4, 1, "euler", "simple"), (4, 1, "euler", "simple")],
    "image_qwen_image_edit_2509": [(4, 1, "euler", "simple")],
}


@pytest.fixture(scope="module")
def object_info() -> dict[str, Any]:
    return json.loads(OBJECT_INFO_PATH.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def shipped() -> dict[str, workflow.Workflow]:
    return workflow.shipped()


def graph_of(wf: workflow.Workflow) -> dict[str, Any]:
    return wf.apply({})


def test_the_five_workflows_ship_with_their_commands(shipped: dict[str, workflow.Workflow]
                                                     ) -> None:
    assert {name: wf.command for name, wf in shipped.items()} == COMMANDS
    assert shipped["video_wan2_2_14B_t2v"].kind == "video"
    assert {wf.kind for name, wf in shipped.items() if name != "video_wan2_2_14B_t2v"} == {
        "image"}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_graph_is_valid_on_comfyui_0_3_64(name: str, shipped: dict[str, workflow.Workflow],
                                          object_info: dict[str, Any]) -> None:
    assert workflow.validate_graph(graph_of(shipped[name]), object_info) == []


# /object_info as served by ComfyUI tag v0.3.64 itself (CPU, without the optional
# spandrel and audio nodes), captured during our contract check. The file above comes
# from a later commit that still calls itself 0.3.64; a graph must be valid on both.
LIVE_OBJECT_INFO_PATH = OBJECT_INFO_PATH.with_name("comfyui-v0.3.64-cpu-live-object_info.json")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_graph_is_valid_on_a_live_comfyui_v0_3_64(
    name: str, shipped: dict[str, workflow.Workflow]
) -> None:
    live = json.loads(LIVE_OBJECT_INFO_PATH.read_text(encoding="utf-8"))
    assert workflow.validate_graph(graph_of(shipped[name]), live) == []


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_link_carries_the_type_its_input_wants(
    name: str, shipped: dict[str, workflow.Workflow], object_info: dict[str, Any]
) -> None:
    graph = graph_of(shipped[name])
    links = 0
    for node in graph.values():
        info = object_info[node["class_type"]]["input"]
        specs = {**info.get("required", {}), **info.get("optional", {})}
        for input_name, value in node["inputs"].items():
            if isinstance(value, list):
                source = graph[value[0]]
                given = object_info[source["class_type"]]["output"][value[1]]
                assert given == specs[input_name][0], (node, input_name)
                links += 1
    assert links >= 7


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_nodes_are_the_templates_active_path(name: str,
                                             shipped: dict[str, workflow.Workflow]) -> None:
    classes = collections.Counter(n["class_type"] for n in graph_of(shipped[name]).values())
    assert dict(classes) == NODES[name]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_model_files_are_the_ones_the_template_names(
    name: str, shipped: dict[str, workflow.Workflow]
) -> None:
    assert set(shipped[name].required_models()) == MODELS[name]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_sampler_settings_are_the_templates(name: str,
                                            shipped: dict[str, workflow.Workflow]) -> None:
    graph = graph_of(shipped[name])
    samplers = [n["inputs"] for _id, n in sorted(graph.items(), key=lambda kv: int(kv[0]))
                if n["class_type"] in ("KSampler", "KSamplerAdvanced")]
    got = [(s["steps"], s["cfg"], s["sampler_name"], s["scheduler"]) for s in samplers]
    assert sorted(got) == sorted(SAMPLERS[name])


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_outputs_are_saved_under_comfyveil(name: str,
                                           shipped: dict[str, workflow.Workflow]) -> None:
    saves = [n for n in graph_of(shipped[name]).values()
             if n["class_type"] in ("SaveImage", "SaveVideo")]
    assert [s["inputs"]["filename_prefix"] for s in saves] == [f"comfyveil/{COMMANDS[name]}"]


def test_flux_dual_clip_and_latent_match_the_template(shipped: dict[str, workflow.Workflow]
                                                      ) -> None:
    graph = graph_of(shipped["flux_schnell_full_text_to_image"])
    clip = next(n for n in graph.values() if n["class_type"] == "DualCLIPLoader")["inputs"]
    assert (clip["clip_name1"], clip["clip_name2"], clip["type"]) == (
        "clip_l.safetensors", "t5xxl_fp16.safetensors", "flux")
    latent = next(n for n in graph.values() if n["class_type"] == "EmptySD3LatentImage")
    assert (latent["inputs"]["width"], latent["inputs"]["height"]) == (1024, 1024)
    dev = graph_of(shipped["flux_dev_full_text_to_image"])
    encode = next(n for n in dev.values() if n["class_type"] == "CLIPTextEncodeFlux")
    assert encode["inputs"]["guidance"] == 3.5


def test_wan_runs_high_then_low_noise_in_four_steps(shipped: dict[str, workflow.Workflow]
                                                    ) -> None:
    graph = graph_of(shipped["video_wan2_2_14B_t2v"])
    latent = next(n for n in graph.values() if n["class_type"] == "EmptyHunyuanLatentVideo")
    assert latent["inputs"] == {"width": 640, "height": 640, "length": 81, "batch_size": 1}
    fps = next(n for n in graph.values() if n["class_type"] == "CreateVideo")["inputs"]["fps"]
    assert fps == 16
    splits = sorted((n["inputs"]["start_at_step"], n["inputs"]["end_at_step"],
                     n["inputs"]["add_noise"]) for n in graph.values()
                    if n["class_type"] == "KSamplerAdvanced")
    assert splits == [(0, 2, "enable"), (2, 4, "disable")]


def test_qwen_takes_a_required_image_into_load_image(shipped: dict[str, workflow.Workflow]
                                                     ) -> None:
    wf = shipped["image_qwen_image_edit_2509"]
    assert wf.image_params == ["image"]
    (target,) = wf.params["image"].targets
    assert wf.graph[target.node]["class_type"] == "LoadImage"
    assert wf.params["image"].required
    with pytest.raises(workflow.ParamError, match="image is required"):
        wf.validate({"prompt": "make it night"})
    graph = wf.apply(wf.validate({"prompt": "make it night", "image": "upload_1.png"}))
    assert graph[target.node]["inputs"]["image"] == "upload_1.png"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_params_cover_prompt_seed_steps_and_keep_template_defaults(
    name: str, shipped: dict[str, workflow.Workflow]
) -> None:
    wf = shipped[name]
    assert wf.prompt_param == "prompt"
    assert wf.params["prompt"].required
    assert {"prompt", "seed", "steps"} <= set(wf.params)
    if wf.kind == "video":
        assert {"width", "height", "length", "fps"} <= set(wf.params)
    elif not wf.image_params:
        assert {"width", "height"} <= set(wf.params)
    for param in wf.params.values():
        if param.default is None:
            continue
        for target in param.targets:
            assert wf.graph[target.node]["inputs"][target.input] == param.default, param.name
    steps = wf.params["steps"]
    assert steps.min is not None and steps.max is not None
    assert steps.min <= steps.default <= steps.max


def test_negative_is_bound_where_the_template_has_one(shipped: dict[str, workflow.Workflow]
                                                      ) -> None:
    with_negative = {name for name, wf in shipped.items() if "negative" in wf.params}
    assert with_negative == {"sd3.5_simple_example", "video_wan2_2_14B_t2v",
                             "image_qwen_image_edit_2509"}
    # Both samplers of each graph get the negative conditioning from the bound node.
    for name in with_negative:
        wf = shipped[name]
        (target,) = wf.params["negative"].targets
        graph = graph_of(wf)
        for node in graph.values():
            if node["class_type"] in ("KSampler", "KSamplerAdvanced"):
                assert node["inputs"]["negative"] == [target.node, 0]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_applied_defaults_and_user_values_still_validate(
    name: str, shipped: dict[str, workflow.Workflow], object_info: dict[str, Any]
) -> None:
    wf = shipped[name]
    given: dict[str, object] = {"prompt": "a lighthouse at dusk"}
    if wf.image_params:
        given["image"] = "upload.png"
    values = wf.validate(given, rng=random.Random(3))
    graph = wf.apply(values)
    assert workflow.validate_graph(graph, object_info) == []
    for target in wf.params["prompt"].targets:
        assert graph[target.node]["inputs"][target.input] == "a lighthouse at dusk"
    (seed_target, *_) = wf.params["seed"].targets
    assert graph[seed_target.node]["inputs"][seed_target.input] == values["seed"]
    # Every other input is the template's own: only prompt, seed and image changed.
    template = graph_of(wf)
    changed = {(node_id, key) for node_id, node in graph.items()
               for key, value in node["inputs"].items()
               if template[node_id]["inputs"][key] != value}
    bound = {(t.node, t.input) for p in ("prompt", "seed", "image") if p in wf.params
             for t in wf.params[p].targets}
    assert changed <= bound

    maxed = wf.apply(wf.validate({**given, "steps": wf.params["steps"].max}))
    assert workflow.validate_graph(maxed, object_info) == []


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_check_on_a_bare_backend_names_only_the_missing_models(
    name: str, shipped: dict[str, workflow.Workflow], object_info: dict[str, Any]
) -> None:
    # This ComfyUI has every node class but no model files installed.
    problems = shipped[name].check(object_info)
    expected = {f"model file {file} ({folder}) is not installed" for folder, file in MODELS[name]}
    assert set(problems) == expected
    installed: dict[str, list[str]] = collections.defaultdict(list)
    for folder, file in MODELS[name]:
        installed[folder].append(file)
    assert shipped[name].check(object_info, installed) == []


def test_a_broken_copy_is_caught(shipped: dict[str, workflow.Workflow],
                                 object_info: dict[str, Any]) -> None:
    graph = copy.deepcopy(graph_of(shipped["flux_schnell_full_text_to_image"]))
    sampler_id = next(k for k, n in graph.items() if n["class_type"] == "KSampler")
    unet_id = next(k for k, n in graph.items() if n["class_type"] == "UNETLoader")
    vae_id = next(k for k, n in graph.items() if n["class_type"] == "VAELoader")
    graph[sampler_id]["inputs"]["model"] = [vae_id, 0]  # a VAE where a MODEL belongs
    graph[sampler_id]["inputs"]["steps"] = 0  # below KSampler's minimum of 1
    graph[unet_id]["class_type"] = "UNETLoaderGGUF"  # a custom node this backend lacks
    problems = workflow.validate_graph(graph, object_info)
    assert len(problems) == 3
    assert f"node {sampler_id} (KSampler) input model expects MODEL but node {vae_id} " \
           "(VAELoader) output 0 gives VAE" in problems
    assert f"node {sampler_id} (KSampler) input steps: 0 is below the minimum 1" in problems
    assert f"node {unet_id}: node type UNETLoaderGGUF is not installed" in problems


def test_hashes_are_distinct_and_stable(shipped: dict[str, workflow.Workflow]) -> None:
    hashes = {wf.hash for wf in shipped.values()}
    assert len(hashes) == len(COMMANDS)
    assert workflow.shipped()["image_qwen_image_edit_2509"].hash == shipped[
        "image_qwen_image_edit_2509"].hash
