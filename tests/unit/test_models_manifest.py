"""[[models]] tables: validated field by field, outside the workflow's hash, and complete
for the shipped workflows."""

from __future__ import annotations

import json

import pytest

from comfyveil.comfy import manifest, workflow
from comfyveil.models import local

GRAPH = json.dumps({
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "a.safetensors"}},
})
GOOD = {
    "repo": "Comfy-Org/flux1-schnell",
    "path": "split_files/a.safetensors",
    "revision": "f757664cb3ff8b19ff99e064a2387a5f547ad9e8",
    "folder": "checkpoints",
    "size": 1234,
    "sha256": "9403429e0052277ac2a87ad800adece5481eecefd9ed334e1f348723621d2a0a",
}


def toml_of(table: dict[str, object]) -> str:
    lines = ['command = "a"', "", "[[models]]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def test_a_table_becomes_a_model_file_named_after_its_path() -> None:
    wf = workflow.loads("a", toml_of(GOOD), GRAPH)
    (model,) = wf.models
    assert model.relative == "checkpoints/a.safetensors"
    assert (model.repo, model.revision, model.size) == (GOOD["repo"], GOOD["revision"], 1234)


def test_hash_does_not_change_when_only_models_change() -> None:
    plain = workflow.loads("a", 'command = "a"\n', GRAPH)
    pinned = workflow.loads("a", toml_of(GOOD), GRAPH)
    other = workflow.loads("a", toml_of({**GOOD, "size": 99}), GRAPH)
    assert plain.hash == pinned.hash == other.hash
    assert pinned.models != other.models


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"revision": "main"}, "revision must be a commit"),
        ({"revision": "F757664CB3FF8B19FF99E064A2387A5F547AD9E8"}, "revision must be a commit"),
        ({"sha256": "9403429e"}, "sha256 must be 64"),
        ({"size": "1234"}, "size must be a whole number"),
        ({"size": 0}, "size must be a whole number"),
        ({"size": True}, "size must be a whole number"),
        ({"folder": "models"}, "is not a ComfyUI models folder"),
        ({"path": "../../etc/passwd"}, "path must be a relative path without '..'"),
        ({"path": "/abs.safetensors"}, "path must be a relative path"),
        ({"path": "a//b.safetensors"}, "path must be a relative path"),
        ({"name": "sub/../../x.safetensors"}, "name must be a relative path"),
        ({"repo": "no-owner"}, "repo must be a Hugging Face id"),
        ({"url": "https://example.invalid/x"}, "unknown key url"),
    ],
)
def test_a_bad_field_is_refused_in_plain_words(change: dict[str, object], words: str) -> None:
    with pytest.raises(workflow.WorkflowError, match="models #1") as caught:
        workflow.loads("a", toml_of({**GOOD, **change}), GRAPH)
    assert words in str(caught.value)


def test_a_missing_field_and_a_duplicate_are_refused() -> None:
    without = {k: v for k, v in GOOD.items() if k != "sha256"}
    with pytest.raises(workflow.WorkflowError, match="sha256 is missing"):
        workflow.loads("a", toml_of(without), GRAPH)
    twice = toml_of(GOOD) + "\n".join(["[[models]]", *(
        f"{k} = {json.dumps(v)}" for k, v in GOOD.items())]) + "\n"
    with pytest.raises(workflow.WorkflowError, match="already listed by models #1"):
        workflow.loads("a", twice, GRAPH)


def test_revision_may_be_left_out_to_pin_by_sha256_alone() -> None:
    table = {k: v for k, v in GOOD.items() if k != "revision"}
    (model,) = workflow.loads("a", toml_of(table), GRAPH).models
    assert model.revision is None


def test_two_commands_wanting_different_bytes_under_one_name_are_refused() -> None:
    one = manifest.parse([GOOD], "x")
    other = manifest.parse([{**GOOD, "sha256": "0" * 64}], "y")
    assert manifest.dedupe([one, one]) == list(one)
    with pytest.raises(manifest.ManifestError, match="different files as checkpoints/a"):
        manifest.dedupe([one, other])


def test_every_shipped_workflow_pins_every_file_its_graph_loads() -> None:
    files: dict[str, manifest.ModelFile] = {}
    for wf in workflow.shipped().values():
        assert {(m.folder, m.filename) for m in wf.models} == set(wf.required_models())
        for model in wf.models:
            assert files.setdefault(model.relative, model) == model  # same file, same pin
    assert len(files) == 16
    unpinned = sorted(m.filename for m in files.values() if m.revision is None)
    assert unpinned == [
        "Qwen-Image-Edit-2509-Lightning-4steps-V1.0-bf16.safetensors",
        "qwen_image_edit_2509_fp8_e4m3fn.safetensors",
    ]


def test_install_command_is_one_line_an_operator_can_paste() -> None:
    assert local.install_command(["f", "wan"], "/srv/Comfy UI") == (
        "comfyveil models install f wan --comfyui-dir '/srv/Comfy UI'"
    )
    assert local.install_command(["qwen"]) == "comfyveil models install qwen --comfyui-dir DIR"
