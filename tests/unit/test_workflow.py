"""Workflows as commands: loading bindings, checking options, binding them into a graph."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest

from comfyveil.comfy import template, workflow
from comfyveil.errors import UsageError

OBJECT_INFO_PATH = Path(__file__).parent.parent / "data" / "comfyui-0.3.64-object_info.json"

GRAPH: dict[str, Any] = {
    "3": {"class_type": "KSampler", "inputs": {
        "model": ["4", 0], "seed": 42, "steps": 4, "cfg": 1.0, "sampler_name": "euler",
        "scheduler": "simple", "positive": ["6", 0], "negative": ["7", 0],
        "latent_image": ["5", 0], "denoise": 1.0}},
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "toy.safetensors"}},
    "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 512, "height": 512,
                                                       "batch_size": 1}},
    "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a cat", "clip": ["4", 1]}},
    "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["4", 1]}},
    "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
    "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0],
                                                "filename_prefix": "comfyveil/t"}},
    "10": {"class_type": "LoadImage", "inputs": {"image": "example.png"}},
}

BINDINGS = """
command = "t"
title = "Toy"
description = "a toy workflow"
kind = "image"

[params.prompt]
node = "6"
input = "text"
type = "text"
required = true
max_length = 20
description = "what to draw"

[params.negative]
node = "7"
input = "text"
type = "text"

[params.seed]
node = "3"
input = "seed"
type = "seed"
aliases = ["n"]

[params.steps]
node = "3"
input = "steps"
type = "int"
min = 1
max = 8

[params.cfg]
node = "3"
input = "cfg"
type = "float"
min = 0.0
max = 10.0

[params.size]
targets = [{node = "5", input = "width"}, {node = "5", input = "height"}]
type = "int"
min = 256
max = 1024
step = 64

[params.sampler]
node = "3"
input = "sampler_name"
type = "choice"
choices = ["euler", "dpmpp_2m"]

[params.image]
node = "10"
input = "image"
type = "image"
"""


def toy(bindings: str = BINDINGS, graph: dict[str, Any] | None = None) -> workflow.Workflow:
    return workflow.loads("toy", bindings, json.dumps(graph if graph is not None else GRAPH))


@pytest.fixture(scope="module")
def object_info() -> dict[str, Any]:
    return json.loads(OBJECT_INFO_PATH.read_text(encoding="utf-8"))


# --- load ------------------------------------------------------------------------------------


def test_load_reads_toml_and_json_side_by_side(tmp_path: Path) -> None:
    (tmp_path / "toy.toml").write_text(BINDINGS, encoding="utf-8")
    (tmp_path / "toy.json").write_text(json.dumps(GRAPH), encoding="utf-8")
    wf = workflow.load(tmp_path / "toy.toml")
    assert (wf.name, wf.command, wf.title, wf.kind) == ("toy", "t", "Toy", "image")
    assert wf.source == tmp_path / "toy.toml"
    assert wf.params["size"].targets == (workflow.Target("5", "width"),
                                         workflow.Target("5", "height"))
    assert wf.image_params == ["image"]
    assert wf.prompt_param == "prompt"


def test_load_refuses_a_binding_to_a_missing_node(tmp_path: Path) -> None:
    (tmp_path / "toy.toml").write_text(BINDINGS.replace('node = "7"', 'node = "77"'))
    (tmp_path / "toy.json").write_text(json.dumps(GRAPH))
    with pytest.raises(workflow.WorkflowError) as caught:
        workflow.load(tmp_path / "toy.toml")
    message = str(caught.value)
    assert "toy.toml" in message
    assert "params.negative" in message
    assert "node 77 is not in the graph" in message


def test_load_refuses_a_binding_to_a_missing_input() -> None:
    with pytest.raises(workflow.WorkflowError, match=r"node 3 \(KSampler\) has no input stepz"):
        toy(BINDINGS.replace('input = "steps"', 'input = "stepz"'))


def test_load_refuses_a_missing_graph_file(tmp_path: Path) -> None:
    (tmp_path / "toy.toml").write_text(BINDINGS)
    with pytest.raises(workflow.WorkflowError, match=r"cannot read .*toy\.json"):
        workflow.load(tmp_path / "toy.toml")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (('kind = "image"', 'kind = "audio"'), "kind must be one of image, video"),
        (('command = "t"', 'command = "T!"'), "command 'T!' must be 1 to 32"),
        (('title = "Toy"', 'titel = "Toy"'), "unknown key titel"),
        (('type = "seed"', 'type = "seeed"'), "type must be one of"),
        (('max = 8', 'max = 8\nmaximum = 9'), "params.steps: unknown key maximum"),
        (('min = 1\n', 'min = "one"\n'), "params.steps: min must be a number"),
        (('min = 1\n', 'min = 9\n'), "params.steps: min is greater than max"),
        (('max = 8', 'max = 3'), "the graph's value does not fit: steps must be between 1 and 3"),
        (('input = "seed"', 'input = "sampler_name"'), "a seed parameter cannot set input"),
        (('input = "seed"', 'input = "model"'), "is a link to another node"),
        (('choices = ["euler", "dpmpp_2m"]', 'choices = ["dpmpp_2m"]'),
         "sampler must be one of: dpmpp_2m (got 'euler')"),
        (('aliases = ["n"]', 'aliases = ["steps"]'), "the name steps is already used"),
        (('command = "t"', 'command = "t"\nfoo = ['), "is not valid TOML"),
    ],
)
def test_load_explains_what_is_wrong_with_bindings(change: tuple[str, str], expected: str) -> None:
    assert change[0] in BINDINGS
    with pytest.raises(workflow.WorkflowError) as caught:
        toy(BINDINGS.replace(change[0], change[1], 1))
    assert expected in str(caught.value)
    assert "toy.toml" in str(caught.value)


def test_loads_refuses_a_ui_format_graph() -> None:
    ui = {"nodes": [], "links": [], "version": 0.4}
    with pytest.raises(workflow.WorkflowError, match="UI-format workflow; save it with Export"):
        toy(graph=ui)


def test_loads_refuses_a_graph_that_is_not_json() -> None:
    with pytest.raises(workflow.WorkflowError, match=r"toy\.json is not valid JSON"):
        workflow.loads("toy", BINDINGS, "{nope")


def test_hash_follows_content_not_identity() -> None:
    assert toy().hash == toy().hash
    assert len(toy().hash) == 64
    assert toy().hash != toy(BINDINGS.replace("max = 8", "max = 7")).hash
    changed = copy.deepcopy(GRAPH)
    changed["3"]["inputs"]["cfg"] = 2.0
    assert toy().hash != toy(graph=changed).hash


def test_free_text_marker_chooses_the_prompt_param() -> None:
    marked = BINDINGS.replace('[params.negative]\nnode = "7"',
                              '[params.negative]\nfree_text = true\nnode = "7"')
    assert toy(marked).prompt_param == "negative"
    renamed = BINDINGS.replace("[params.prompt]", "[params.text]")
    assert toy(renamed).prompt_param is None


# --- validate --------------------------------------------------------------------------------


def test_validate_coerces_strings_and_fills_the_graphs_defaults() -> None:
    values = toy().validate({"prompt": "a dog", "steps": "6", "cfg": "2.5", "size": "768",
                             "image": "in.png"}, rng=random.Random(1))
    assert values["steps"] == 6
    assert values["cfg"] == 2.5
    assert values["size"] == 768
    assert values["negative"] == "blurry"  # the template's own value is the default
    assert values["sampler"] == "euler"
    assert values["image"] == "in.png"
    assert set(values) == {"prompt", "negative", "seed", "steps", "cfg", "size", "sampler",
                           "image"}


def test_validate_keeps_the_template_default_when_not_given() -> None:
    assert toy().validate({"prompt": "x"})["steps"] == 4


def test_validate_draws_a_seed_in_range_and_respects_a_given_one() -> None:
    wf = toy()
    seeds = {wf.validate({"prompt": "x"}, rng=random.Random(i))["seed"] for i in range(20)}
    assert len(seeds) == 20
    assert all(isinstance(s, int) and 0 <= s <= workflow.SEED_MAX for s in seeds)
    assert (wf.validate({"prompt": "x"}, rng=random.Random(7))
            == wf.validate({"prompt": "x"}, rng=random.Random(7)))
    assert wf.validate({"prompt": "x", "n": "123"})["seed"] == 123


def test_validate_draws_within_a_seed_params_own_max() -> None:
    wf = toy(BINDINGS.replace('aliases = ["n"]', 'aliases = ["n"]\nmax = 10'))
    seeds = {wf.validate({"prompt": "x"}, rng=random.Random(i))["seed"] for i in range(50)}
    assert seeds <= set(range(11))
    with pytest.raises(workflow.ParamError, match=r"seed must be between 0 and 10 \(got 11\)"):
        wf.validate({"prompt": "x", "seed": 11})


@pytest.mark.parametrize(
    "seed_binding",
    [
        'type = "seed"\ndefault = 1',  # a seed with a default
        'type = "int"\ndefault = 1',  # an int on the sampler's seed input, as operators write
        'type = "int"',  # an int whose default is the graph's value (42)
    ],
)
def test_a_seed_is_drawn_afresh_whatever_its_default(seed_binding: str) -> None:
    """The same seed would repeat the last image (and ComfyUI would answer it from its
    cache): a seed not given is drawn for every run, a default never wins."""
    wf = toy(BINDINGS.replace('type = "seed"', seed_binding))
    assert wf.seed_params == ("seed",)
    seeds = {wf.validate({"prompt": "x"}, rng=random.Random(i))["seed"] for i in range(20)}
    assert len(seeds) == 20
    assert wf.validate({"prompt": "x", "seed": 5})["seed"] == 5  # one asked for is kept
    job = wf.validate({"prompt": "x"})
    assert wf.without_seeds(job) == {k: v for k, v in job.items() if k != "seed"}


def test_a_seed_set_through_a_primitive_is_a_seed_and_an_unbound_one_is_named() -> None:
    graph = copy.deepcopy(GRAPH)
    graph["11"] = {"class_type": "PrimitiveInt", "inputs": {"value": 7}}
    graph["3"]["inputs"]["seed"] = ["11", 0]
    noise = BINDINGS.replace('[params.seed]\nnode = "3"\ninput = "seed"\ntype = "seed"',
                             '[params.noise]\nnode = "11"\ninput = "value"\ntype = "int"')
    wf = toy(noise, graph)
    assert wf.seed_params == ("noise",) and wf.fixed_seeds() == []
    assert len({wf.validate({"prompt": "x"})["noise"] for _ in range(5)}) == 5
    no_seed = BINDINGS.replace('[params.seed]\nnode = "3"\ninput = "seed"\ntype = "seed"\n'
                               'aliases = ["n"]', "")
    unbound = toy(no_seed)
    assert unbound.seed_params == () and unbound.fixed_seeds() == [("3", "KSampler", "seed")]
    # A sampler that adds no noise (Wan's second one) has a seed that does not matter.
    quiet = copy.deepcopy(GRAPH)
    quiet["3"] = {"class_type": "KSamplerAdvanced", "inputs": {
        **{k: v for k, v in GRAPH["3"]["inputs"].items() if k not in ("seed", "denoise")},
        "add_noise": "disable", "noise_seed": 0, "start_at_step": 0, "end_at_step": 4,
        "return_with_leftover_noise": "disable"}}
    assert toy(no_seed, quiet).fixed_seeds() == []
    quiet["3"]["inputs"]["add_noise"] = "enable"
    assert toy(no_seed, quiet).fixed_seeds() == [("3", "KSamplerAdvanced", "noise_seed")]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"steps": "20"}, "steps must be between 1 and 8 (got 20)"),
        ({"steps": 0}, "steps must be between 1 and 8 (got 0)"),
        ({"steps": "four"}, "steps must be a whole number (got 'four')"),
        ({"steps": "4.5"}, "steps must be a whole number (got '4.5')"),
        ({"steps": True}, "steps must be a whole number"),
        ({"cfg": "nan"}, "cfg must be a number (got 'nan')"),
        ({"cfg": "11"}, "cfg must be between 0 and 10 (got 11)"),
        ({"size": "1000"}, "size must be a multiple of 64 (got 1000)"),
        ({"sampler": "heun"}, "sampler must be one of: euler, dpmpp_2m (got 'heun')"),
        ({"seed": "-1"}, "seed must be between 0 and 9007199254740991 (got -1)"),
        ({"foo": "1"}, "unknown option --foo; options: cfg, image, negative, prompt, "
                       "sampler, seed, size, steps"),
        ({"prompt": "x" * 21}, "prompt is too long (21 characters, at most 20)"),
        ({"prompt": "   "}, "prompt must not be empty"),
        ({"prompt": 5}, "prompt must be text"),
        ({"prompt": None}, "prompt is required: what to draw"),
        ({"image": ""}, "image must be an image"),
    ],
)
def test_validate_refuses_bad_values_in_one_sentence(values: dict[str, object],
                                                      message: str) -> None:
    given = {"prompt": "ok", **values}
    with pytest.raises(workflow.ParamError) as caught:
        toy().validate(given)
    assert str(caught.value) == message
    assert isinstance(caught.value, UsageError)


def test_validate_never_repeats_the_prompt_text_in_an_error() -> None:
    secret = "my secret prompt " * 3
    with pytest.raises(workflow.ParamError) as caught:
        toy().validate({"prompt": secret})
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize("bad", ["a fox\x00", "a\x1bfox", "a fox\x7f", "a fox\ud800"])
def test_validate_refuses_control_characters_in_text_plainly(bad: str) -> None:
    # A NUL once reached PostgreSQL, whose error quoted the prompt (issue 22 §8).
    with pytest.raises(workflow.ParamError) as caught:
        toy().validate({"prompt": bad})
    assert str(caught.value) == "prompt must not hold control characters"
    assert toy().validate({"prompt": "two\r\nlines\tand a tab"})["prompt"] == (
        "two\r\nlines\tand a tab"
    )


def test_validate_requires_a_required_image() -> None:
    required = BINDINGS.replace('input = "image"\ntype = "image"',
                                'input = "image"\ntype = "image"\nrequired = true')
    with pytest.raises(workflow.ParamError, match="image is required"):
        toy(required).validate({"prompt": "x"})
    assert toy(required).validate({"prompt": "x", "image": Path("/tmp/a.png")})["image"] == Path(
        "/tmp/a.png")


def test_validate_refuses_the_same_option_twice_by_alias() -> None:
    with pytest.raises(workflow.ParamError, match="seed is given twice"):
        toy().validate({"prompt": "x", "seed": 1, "n": 2})


def test_validate_coerces_bool() -> None:
    bindings = BINDINGS + '\n[params.flag]\nnode = "11"\ninput = "on"\ntype = "bool"\n'
    graph = {**GRAPH, "11": {"class_type": "Toy", "inputs": {"on": False}}}
    wf = toy(bindings, graph)
    assert wf.validate({"prompt": "x", "flag": "yes"})["flag"] is True
    assert wf.validate({"prompt": "x"})["flag"] is False
    with pytest.raises(workflow.ParamError, match="flag must be yes or no"):
        wf.validate({"prompt": "x", "flag": "maybe"})


# --- apply -----------------------------------------------------------------------------------


def test_apply_sets_every_target_and_leaves_the_template_alone() -> None:
    wf = toy()
    before = json.dumps(template.thaw(wf.graph), sort_keys=True)
    values = wf.validate({"prompt": "a dog", "seed": 9, "size": 768, "image": "up/in.png"})
    graph = wf.apply(values)
    assert graph["6"]["inputs"]["text"] == "a dog"
    assert graph["3"]["inputs"]["seed"] == 9
    assert graph["5"]["inputs"]["width"] == graph["5"]["inputs"]["height"] == 768
    assert graph["10"]["inputs"]["image"] == "up/in.png"
    assert graph["3"]["inputs"]["model"] == ["4", 0]  # links untouched
    graph["3"]["inputs"]["steps"] = 99  # the copy is the caller's own
    again = wf.apply(values)
    assert again["3"]["inputs"]["steps"] == 4
    assert json.dumps(template.thaw(wf.graph), sort_keys=True) == before
    assert wf.graph["6"]["inputs"]["text"] == "a cat"


def test_apply_leaves_params_not_given_at_the_graphs_value() -> None:
    graph = toy().apply({"prompt": "x"})
    assert graph["3"]["inputs"]["seed"] == 42
    assert graph == {**json.loads(json.dumps(GRAPH)),
                     "6": {"class_type": "CLIPTextEncode",
                           "inputs": {"text": "x", "clip": ["4", 1]}}}


def test_apply_writes_a_path_image_as_text_and_refuses_unknown_names() -> None:
    assert toy().apply({"image": Path("a/b.png")})["10"]["inputs"]["image"] == "a/b.png"
    with pytest.raises(workflow.ParamError, match="unknown option --bogus"):
        toy().apply({"bogus": 1})


def test_the_graph_cannot_be_changed_in_place() -> None:
    wf = toy()
    with pytest.raises(TypeError):
        wf.graph["6"]["inputs"]["text"] = "changed"  # type: ignore[index]


# --- check and validate_graph ----------------------------------------------------------------


def test_required_models_lists_loader_files() -> None:
    assert toy().required_models() == [("checkpoints", "toy.safetensors")]


def test_check_names_missing_node_types_and_models(object_info: dict[str, Any]) -> None:
    graph = copy.deepcopy(GRAPH)
    graph["11"] = {"class_type": "FancyUpscaler", "inputs": {"image": ["8", 0]}}
    problems = toy(graph=graph).check(object_info)
    assert "node type FancyUpscaler is not installed" in problems
    assert "model file toy.safetensors (checkpoints) is not installed" in problems
    assert len(problems) == 2


def test_check_passes_when_the_backend_lists_the_model(object_info: dict[str, Any]) -> None:
    info = copy.deepcopy(object_info)
    info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0] = ["toy.safetensors"]
    assert toy().check(info) == []


def test_check_uses_models_lists_as_an_extra_source(object_info: dict[str, Any]) -> None:
    wf = toy()
    assert wf.check(object_info, {"checkpoints": ["toy.safetensors"]}) == []
    assert wf.check(object_info, {"checkpoints": ["other.safetensors"]}) == [
        "model file toy.safetensors (checkpoints) is not installed"]


def test_check_reports_a_bad_sampler_for_this_backend(object_info: dict[str, Any]) -> None:
    graph = copy.deepcopy(GRAPH)
    graph["3"]["inputs"]["sampler_name"] = "warp_drive"
    problems = toy(BINDINGS.replace('["euler", "dpmpp_2m"]', '["warp_drive"]'),
                   graph).check(object_info, {"checkpoints": ["toy.safetensors"]})
    assert len(problems) == 1
    assert "node 3 (KSampler) input sampler_name: 'warp_drive' is not one of" in problems[0]


def test_validate_graph_accepts_the_toy_graph(object_info: dict[str, Any]) -> None:
    assert workflow.validate_graph(GRAPH, object_info) == []


def test_validate_graph_finds_each_kind_of_problem(object_info: dict[str, Any]) -> None:
    graph = copy.deepcopy(GRAPH)
    graph["3"]["inputs"]["positive"] = ["4", 0]  # MODEL into CONDITIONING
    graph["3"]["inputs"]["steps"] = 20000
    graph["3"]["inputs"]["cfg"] = "high"
    del graph["3"]["inputs"]["denoise"]
    graph["8"]["inputs"]["vae"] = ["99", 0]
    graph["9"]["inputs"]["images"] = ["8", 3]
    graph["7"]["inputs"]["clip"] = "clip"
    graph["12"] = {"class_type": "NoSuchNode", "inputs": {}}
    problems = workflow.validate_graph(graph, object_info)
    assert problems == [
        "node 3 (KSampler) lacks its required input denoise",
        "node 3 (KSampler) input steps: 20000 is above the maximum 10000",
        "node 3 (KSampler) input cfg: 'high' is not a number",
        "node 3 (KSampler) input positive expects CONDITIONING but node 4 "
        "(CheckpointLoaderSimple) output 0 gives MODEL",
        "node 7 (CLIPTextEncode) input clip: must be linked to a CLIP output, not set to a value",
        "node 8 (VAEDecode) input vae is linked to node 99, which does not exist",
        "node 9 (SaveImage) input images is linked to output 3 of node 8 (VAEDecode), "
        "which has 1 output(s)",
        "node 12: node type NoSuchNode is not installed",
    ]


def test_validate_graph_matches_wildcard_and_comma_types() -> None:
    info = {
        "Src": {"input": {}, "output": ["IMAGE,MASK"]},
        "Any": {"input": {}, "output": ["*"]},
        "Sink": {"input": {"required": {"a": ["MASK"], "b": ["LATENT"], "c": ["LATENT"]}},
                 "output": []},
    }
    graph = {"1": {"class_type": "Src", "inputs": {}}, "2": {"class_type": "Any", "inputs": {}},
             "3": {"class_type": "Sink", "inputs": {"a": ["1", 0], "b": ["2", 0],
                                                    "c": ["1", 0]}}}
    assert workflow.validate_graph(graph, info) == [
        "node 3 (Sink) input c expects LATENT but node 1 (Src) output 0 gives IMAGE,MASK"]


def test_validate_graph_reads_v3_combos(object_info: dict[str, Any]) -> None:
    graph = {"1": {"class_type": "ImageScaleToTotalPixels",
                   "inputs": {"image": ["2", 0], "upscale_method": "sideways",
                              "megapixels": 1.0}},
             "2": {"class_type": "LoadImage", "inputs": {"image": "anything.png"}}}
    problems = workflow.validate_graph(graph, object_info)
    assert len(problems) == 1
    assert problems[0].startswith(
        "node 1 (ImageScaleToTotalPixels) input upscale_method: 'sideways' is not one of")


# --- shipped and find ------------------------------------------------------------------------


def test_find_by_name_command_slash_and_path(tmp_path: Path) -> None:
    by_name = workflow.find("flux_schnell_full_text_to_image")
    assert workflow.find("f") == by_name
    assert workflow.find("/f") == by_name
    assert by_name.source is not None
    (tmp_path / "toy.toml").write_text(BINDINGS)
    (tmp_path / "toy.json").write_text(json.dumps(GRAPH))
    assert workflow.find(str(tmp_path / "toy.toml")).command == "t"
    assert workflow.find("t", extra_dirs=[tmp_path]).name == "toy"


def test_find_unknown_lists_what_exists() -> None:
    with pytest.raises(workflow.WorkflowError) as caught:
        workflow.find("nope")
    message = str(caught.value)
    assert message.startswith("unknown workflow nope; known: ")
    for command in ("f", "fd", "qwen", "sd3", "wan"):
        assert f"{command} (" in message


def test_find_prefers_an_operators_workflow_of_the_same_name(tmp_path: Path) -> None:
    (tmp_path / "flux_schnell_full_text_to_image.toml").write_text(
        BINDINGS.replace('command = "t"', 'command = "mine"'))
    (tmp_path / "flux_schnell_full_text_to_image.json").write_text(json.dumps(GRAPH))
    assert workflow.find("flux_schnell_full_text_to_image", extra_dirs=[tmp_path]).command == "mine"


def test_find_a_missing_path() -> None:
    with pytest.raises(workflow.WorkflowError, match="no workflow file"):
        workflow.find("/nonexistent/x.toml")


@pytest.mark.parametrize(
    ("values", "refusal"),
    [
        # At each bound the value passes; one past it (or off the step) it is refused.
        ({"steps": 1}, None),
        ({"steps": 0}, "steps must be between 1 and 8 (got 0)"),
        ({"steps": 8}, None),
        ({"steps": 9}, "steps must be between 1 and 8 (got 9)"),
        ({"cfg": 0.0}, None),
        ({"cfg": -0.001}, "cfg must be between 0 and 10 (got -0.001)"),
        ({"cfg": 10.0}, None),
        ({"cfg": 10.001}, "cfg must be between 0 and 10 (got 10.001)"),
        ({"size": 256}, None),
        ({"size": 255}, "size must be between 256 and 1024 (got 255)"),
        ({"size": 192}, "size must be between 256 and 1024 (got 192)"),  # on the step
        ({"size": 1024}, None),
        ({"size": 1025}, "size must be between 256 and 1024 (got 1025)"),
        ({"size": 1088}, "size must be between 256 and 1024 (got 1088)"),  # on the step
        ({"size": 320}, None),
        ({"size": 319}, "size must be a multiple of 64 (got 319)"),
        ({"size": 321}, "size must be a multiple of 64 (got 321)"),
        ({"seed": 0}, None),
        ({"seed": -1}, f"seed must be between 0 and {workflow.SEED_MAX} (got -1)"),
        ({"seed": workflow.SEED_MAX}, None),
        ({"seed": workflow.SEED_MAX + 1},
         f"seed must be between 0 and {workflow.SEED_MAX} (got {workflow.SEED_MAX + 1})"),
        ({"prompt": "x" * 20}, None),
        ({"prompt": "x" * 21}, "prompt is too long (21 characters, at most 20)"),
        ({"prompt": "x", "negative": "y" * 500}, None),  # no max_length: no limit
    ],
)
def test_every_option_bound_is_exact(values: dict[str, Any], refusal: str | None) -> None:
    wf = toy()
    given = {"prompt": "a dog", **values}
    if refusal is None:
        validated = wf.validate(given)
        assert all(validated[name] == value for name, value in values.items())
        graph = wf.apply(validated)
        for name, value in values.items():
            for target in wf.params[name].targets:
                assert graph[target.node]["inputs"][target.input] == value
    else:
        with pytest.raises(workflow.ParamError) as raised:
            wf.validate(given)
        assert str(raised.value) == refusal


def test_a_step_counts_from_the_minimum() -> None:
    wf = toy(BINDINGS.replace("min = 256\nmax = 1024\nstep = 64",
                              "min = 32\nmax = 1024\nstep = 96"))
    assert wf.validate({"prompt": "x", "size": 128})["size"] == 128
    with pytest.raises(workflow.ParamError, match=r"size must be 32 plus a multiple of 96"):
        wf.validate({"prompt": "x", "size": 129})


def test_an_options_label_and_description_may_carry_translations() -> None:
    """An operator's option gets a label and translated texts (``label.fa``,
    ``description.ru``); without them an option and the workflow's hash stay as they were."""
    plain = toy()
    texts = toy(BINDINGS.replace(
        'description = "what to draw"\n',
        'description.default = "what to draw"\ndescription.ru = "что нарисовать"\n'
        'label.default = "Idea"\nlabel.fa = "ایده"\nlabel.zh-Hans = "想法"\n',
    ))
    prompt = texts.params["prompt"]
    assert prompt.description == "what to draw" and prompt.label == "Idea"
    assert prompt.description_in("ru-RU") == "что нарисовать"
    assert prompt.description_in("fa") == "what to draw"
    assert (prompt.label_in("fa"), prompt.label_in("zh"), prompt.label_in("es")) == (
        "ایده", "想法", "Idea"
    )
    assert plain.params["prompt"].label_in("fa") == ""
    assert "label" not in plain.params["prompt"].to_dict()
    assert texts.hash != plain.hash
    with pytest.raises(workflow.WorkflowError, match=r"params.prompt: label needs a default"):
        toy(BINDINGS.replace('description = "what to draw"\n', 'label.fa = "ایده"\n'))
