"""The size a workflow uses an input image at, read from its graph or its TOML."""

from __future__ import annotations

import json
from typing import Any

import pytest

from comfyveil.comfy import fit, workflow
from tests.fixtures.photos import comfy_total_pixels

IMAGE = """
command = "e"
title = "Edit"
kind = "image"

[params.image]
node = "1"
input = "image"
type = "image"
"""


def graph(*middle: tuple[str, str, dict[str, Any]], use: str = "VAEEncode") -> dict[str, Any]:
    """LoadImage (1) -> each node in `middle` in turn -> a `use` node that takes IMAGE."""
    nodes: dict[str, Any] = {"1": {"class_type": "LoadImage", "inputs": {"image": "x.png"}}}
    previous = "1"
    for node_id, kind, inputs in middle:
        nodes[node_id] = {"class_type": kind, "inputs": {"image": [previous, 0], **inputs}}
        previous = node_id
    key = "pixels" if use == "VAEEncode" else "images"
    nodes["99"] = {"class_type": use, "inputs": {key: [previous, 0]}}
    return nodes


def fit_of(nodes: dict[str, Any], bindings: str = IMAGE) -> fit.Fit:
    wf = workflow.loads("e", bindings, json.dumps(nodes))
    return fit.fit_for(wf.apply({}), wf.params["image"])


@pytest.mark.parametrize("megapixels", [0.25, 1.0, 2.0])
def test_qwen_images_are_sent_at_the_size_its_scaling_node_makes(megapixels: float) -> None:
    wf = workflow.shipped()["image_qwen_image_edit_2509"]
    values = wf.validate({"prompt": "a hat", "image": "x.png", "megapixels": megapixels})
    need = fit.fit_for(wf.apply(values), wf.params["image"])
    for size in [(4000, 3000), (3024, 4032), (2560, 1600), (1920, 1081)]:
        made = comfy_total_pixels(*size, megapixels)
        # Where ComfyUI would scale it up, it goes as it is: ComfyUI scales it up itself.
        assert need.size(*size) == (made if made[0] < size[0] else size)


def test_an_image_smaller_than_the_workflow_uses_keeps_its_size() -> None:
    need = fit_of(
        graph(("2", "ImageScaleToTotalPixels", {"megapixels": 1.0, "upscale_method": "lanczos"}))
    )
    assert need.size(640, 480) == (640, 480)  # ComfyUI scales it up itself; we never do


def test_every_shipped_image_parameter_has_a_known_size() -> None:
    for wf in workflow.shipped().values():
        for name in wf.image_params:
            need = fit.fit_for(wf.apply({}), wf.params[name])
            assert need.limited, f"{wf.name}: {name} declares no largest size"
            assert wf.params[name].max_pixels is not None, f"{wf.name}: {name}"


def test_image_scale_with_one_side_zero_keeps_comfyuis_rounding() -> None:
    need = fit_of(
        graph(
            (
                "2",
                "ImageScale",
                {"width": 0, "height": 512, "crop": "disabled", "upscale_method": "lanczos"},
            )
        )
    )
    assert need.size(4000, 3001) == (round(4000 * 512 / 3001), 512)


def test_image_scale_to_a_box_covers_the_box() -> None:
    need = fit_of(
        graph(
            (
                "2",
                "ImageScale",
                {"width": 1024, "height": 1024, "crop": "center", "upscale_method": "lanczos"},
            )
        )
    )
    width, height = need.size(4000, 2000)
    assert height == 1024 and width == 2048  # cropped there to 1024 x 1024, from all of it


def test_a_scale_by_before_the_scaling_node_is_counted() -> None:
    need = fit_of(
        graph(
            ("2", "ImageScaleBy", {"scale_by": 0.5, "upscale_method": "lanczos"}),
            ("3", "ImageScaleToTotalPixels", {"megapixels": 1.0, "upscale_method": "lanczos"}),
        )
    )
    width, height = need.size(8000, 6000)
    assert width * height >= 4 * 1024 * 1024 > (width - 2) * (height - 2)


def test_a_scale_by_alone_bounds_nothing() -> None:
    need = fit_of(graph(("2", "ImageScaleBy", {"scale_by": 0.5, "upscale_method": "lanczos"})))
    assert not need.limited and need.size(8000, 6000) == (8000, 6000)


def test_an_image_used_at_its_own_size_is_sent_whole() -> None:
    assert fit_of(graph()).size(8000, 6000) == (8000, 6000)  # straight into VAEEncode
    both = graph(("2", "ImageScaleToTotalPixels", {"megapixels": 1.0, "upscale_method": "lanczos"}))
    both["50"] = {"class_type": "SaveImage", "inputs": {"images": ["1", 0]}}
    assert fit_of(both).size(8000, 6000) == (8000, 6000)  # another use takes all of it


def test_a_used_mask_sets_no_bound_from_the_graph() -> None:
    nodes = graph(
        ("2", "ImageScaleToTotalPixels", {"megapixels": 1.0, "upscale_method": "lanczos"})
    )
    nodes["60"] = {"class_type": "InvertMask", "inputs": {"mask": ["1", 1]}}
    need = fit_of(nodes)
    assert need.uses_mask and need.size(8000, 6000) == (8000, 6000)


def test_the_largest_of_two_scaled_uses_wins() -> None:
    nodes = graph(
        ("2", "ImageScaleToTotalPixels", {"megapixels": 0.25, "upscale_method": "lanczos"})
    )
    nodes["3"] = {
        "class_type": "ImageScaleToTotalPixels",
        "inputs": {"image": ["1", 0], "megapixels": 1.0, "upscale_method": "lanczos"},
    }
    assert fit_of(nodes).size(4000, 3000) == comfy_total_pixels(4000, 3000, 1.0)


def test_an_operators_max_pixels_and_max_side_bound_any_graph() -> None:
    need = fit_of(graph(), IMAGE + "max_pixels = 1000000\n")
    width, height = need.size(4000, 3000)
    assert width * height <= 1_000_000 and width >= 1150
    need = fit_of(graph(), IMAGE + "max_side = 1024\n")
    assert need.size(4000, 3000) == (1024, 768)
    # With a graph that bounds it too, the smaller wins.
    scaled = graph(
        ("2", "ImageScaleToTotalPixels", {"megapixels": 1.0, "upscale_method": "lanczos"})
    )
    assert fit_of(scaled, IMAGE + "max_side = 800\n").size(4000, 3000) == (800, 600)


@pytest.mark.parametrize("line", ["max_pixels = 0", 'max_side = "big"'])
def test_a_bad_size_key_is_refused(line: str) -> None:
    with pytest.raises(workflow.WorkflowError, match=line.split()[0]):
        fit_of(graph(), IMAGE + line + "\n")


def test_a_size_key_is_for_images_only() -> None:
    text = IMAGE + '\n[params.word]\nnode = "1"\ninput = "image"\ntype = "text"\nmax_side = 9\n'
    with pytest.raises(workflow.WorkflowError, match="image only"):
        fit_of(graph(), text)


def test_sides_rounded_to_steps_are_never_undercut() -> None:
    # Newer ComfyUI rounds each side to a multiple of resolution_steps: up to 64 more here.
    need = fit_of(
        graph(
            (
                "2",
                "ImageScaleToTotalPixels",
                {"megapixels": 1.0, "upscale_method": "lanczos", "resolution_steps": 64},
            )
        )
    )
    width, height = need.size(4000, 3000)
    made = (round(4000 * 0.2955 / 64) * 64, round(3000 * 0.2955 / 64) * 64)  # what it makes
    assert width >= made[0] and height >= made[1] and width * height < 1.3 * 1024 * 1024
