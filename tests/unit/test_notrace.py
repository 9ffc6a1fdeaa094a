"""The graph rewrite and the attribution of SaveImageWebsocket frames to their nodes."""

from __future__ import annotations

import json
import struct

import pytest

from comfyveil.comfy import errors, events, notrace, workflow

PNG = b"\x89PNG\r\n\x1a\nfake"


def _legacy(image: bytes) -> events.Event:
    return events.parse_binary(struct.pack(">II", 1, 2) + image)


def _with_metadata(node: str, image: bytes) -> events.Event:
    meta = json.dumps(
        {
            "node_id": node,
            "prompt_id": "p",
            "display_node_id": node,
            "parent_node_id": None,
            "real_node_id": node,
            "image_type": "image/png",
        }
    ).encode()
    return events.parse_binary(struct.pack(">II", 4, len(meta)) + meta + image)


def test_savers_become_websocket_savers_with_the_same_ids_and_images() -> None:
    graph = workflow.find("f").apply({"prompt": "x"})
    graph["99"] = {"class_type": "PreviewImage", "inputs": {"images": ["8", 0]}}
    rewritten, savers = notrace.to_websocket(graph)
    assert savers == {"9": "f", "99": "ComfyUI"}
    assert rewritten["9"] == {
        "class_type": "SaveImageWebsocket",
        "inputs": {"images": graph["9"]["inputs"]["images"]},
    }
    assert graph["9"]["class_type"] == "SaveImage"  # the input graph is left alone
    assert notrace.file_writers(rewritten) == []


def test_video_savers_are_named_as_file_writers() -> None:
    graph = workflow.find("wan").apply({"prompt": "x"})
    assert notrace.to_websocket(graph)[1] == {}
    assert notrace.file_writers(graph) == [("80", "SaveVideo")]


def test_legacy_frames_belong_to_the_node_last_executing_and_previews_are_ignored() -> None:
    collector = notrace.FrameCollector({"9": "f", "12": "g"})
    stream = [
        events.Executing("p", "3"),
        _legacy(b"sampler preview"),  # a KSampler's preview
        events.Executing("p", "9"),
        events.Progress("p", "9", 0, 2),
        _legacy(PNG + b"1"),
        events.Progress("p", "9", 1, 2),
        _legacy(PNG + b"2"),
        events.Executing("p", "12"),
        events.Progress("p", "12", 0, 1),
        _legacy(PNG + b"3"),
    ]
    for event in stream:
        collector.feed(event, "gpu0")
    files = collector.outputs("p", "gpu0")
    assert [(f.node_id, f.filename, d) for f, d in files] == [
        ("9", "f_00001_.png", PNG + b"1"),
        ("9", "f_00002_.png", PNG + b"2"),
        ("12", "g_00001_.png", PNG + b"3"),
    ]


def test_frames_with_metadata_name_their_node_whatever_ran_last() -> None:
    collector = notrace.FrameCollector({"9": "f"})
    for event in (
        events.Executing("p", "3"),
        _with_metadata("9", PNG),
        _with_metadata("3", b"preview"),
        events.Progress("p", "9", 0, 1),
    ):
        collector.feed(event, "gpu0")
    ((file, data),) = collector.outputs("p", "gpu0")
    assert file.node_id == "9" and data == PNG


def test_missing_frames_are_lost_images_not_an_empty_result() -> None:
    collector = notrace.FrameCollector({"9": "f"})
    collector.feed(events.Executing("p", "9"), "gpu0")
    collector.feed(events.Progress("p", "9", 0, 2), "gpu0")
    collector.feed(_legacy(PNG), "gpu0")  # the second of two never came
    with pytest.raises(notrace.FramesLost):
        collector.outputs("p", "gpu0")
    with pytest.raises(notrace.FramesLost):
        notrace.FrameCollector({"9": "f"}).outputs("p", "gpu0")


def test_frames_are_held_to_the_jobs_output_limits() -> None:
    collector = notrace.FrameCollector({"9": "f"}, max_frame_bytes=20, max_files=2)
    collector.feed(events.Executing("p", "9"), "gpu0")
    with pytest.raises(errors.OutputTooLarge, match="a file larger than"):
        collector.feed(_legacy(PNG + b"far too large"), "gpu0")
    together = notrace.FrameCollector({"9": "f"}, max_frame_bytes=20, max_files=5)
    together.feed(events.Executing("p", "9"), "gpu0")
    together.feed(_legacy(PNG), "gpu0")
    with pytest.raises(errors.OutputTooLarge, match="of files for one job"):
        together.feed(_legacy(PNG), "gpu0")
    counted = notrace.FrameCollector({"9": "f"}, max_files=2)
    counted.feed(events.Executing("p", "9"), "gpu0")
    counted.feed(_legacy(PNG), "gpu0")
    counted.feed(_legacy(PNG), "gpu0")
    with pytest.raises(errors.TooManyOutputs):
        counted.feed(_legacy(PNG), "gpu0")


def test_traces_reference_files_by_annotated_name() -> None:
    trace = notrace.upload_trace("image/jpeg")
    assert trace.folder == "temp" and trace.name.endswith(".jpg")
    assert trace.reference == f"{trace.name} [temp]"
    assert notrace.upload_trace("image/jpeg").name != trace.name  # random, not content
