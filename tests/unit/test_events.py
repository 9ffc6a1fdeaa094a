"""Parsing ComfyUI WebSocket messages (captures from notes/comfyui-api.md §8)."""

from __future__ import annotations

import json
import struct

import pytest

from comfyveil.comfy import errors, events, results

PID = "b97bb3ec-e40a-4704-b391-907c960c6f69"


def test_hello_status_carries_sid_and_queue() -> None:
    event = events.parse_text(
        '{"type":"status","data":{"status":{"exec_info":{"queue_remaining":0}},'
        '"sid":"probe-8f3406d3"}}'
    )
    assert event == events.Status(None, queue_remaining=0, sid="probe-8f3406d3")


def test_execution_lifecycle_messages() -> None:
    start = events.parse_text(
        f'{{"type":"execution_start","data":{{"prompt_id":"{PID}","timestamp":1796204656136}}}}'
    )
    assert start == events.ExecutionStart(PID, 1796204656136)
    cached = events.parse_text(
        f'{{"type":"execution_cached","data":{{"nodes":["1","2"],"prompt_id":"{PID}",'
        '"timestamp":1796204656140}}'
    )
    assert isinstance(cached, events.ExecutionCached) and cached.nodes == ("1", "2")
    executing = events.parse_text(
        f'{{"type":"executing","data":{{"node":"1","display_node":"1","prompt_id":"{PID}"}}}}'
    )
    assert executing == events.Executing(PID, "1", "1")
    done = events.parse_text(f'{{"type":"executing","data":{{"node":null,"prompt_id":"{PID}"}}}}')
    assert done == events.Executing(PID, None)
    executed = events.parse_text(json.dumps({"type": "executed", "data": {
        "node": "2", "display_node": "2", "prompt_id": PID,
        "output": {"images": [{"filename": "probe1_00001_.png", "subfolder": "",
                               "type": "output"}]}}}))
    assert isinstance(executed, events.Executed)
    assert executed.output["images"][0]["filename"] == "probe1_00001_.png"
    success = events.parse_text(
        f'{{"type":"execution_success","data":{{"prompt_id":"{PID}","timestamp":1796204656146}}}}'
    )
    assert success == events.ExecutionSuccess(PID, 1796204656146)


def test_reconnect_executing_has_no_prompt_id() -> None:
    assert events.parse_text('{"type":"executing","data":{"node":"11"}}') == events.Executing(
        None, "11"
    )


def test_progress_and_progress_state() -> None:
    progress = events.parse_text(
        '{"type":"progress","data":{"value":1,"max":2,"prompt_id":"8687","node":"2"}}'
    )
    assert progress == events.Progress("8687", "2", 1.0, 2.0)
    state = events.parse_text(json.dumps({"type": "progress_state", "data": {
        "prompt_id": PID, "nodes": {"1": {
            "value": 0.0, "max": 1.0, "state": "running", "node_id": "1", "prompt_id": PID,
            "display_node_id": "1", "parent_node_id": None, "real_node_id": "1"}}}}))
    assert isinstance(state, events.ProgressState)
    assert state.nodes["1"].state == "running" and state.nodes["1"].max == 1.0


def test_execution_error_drops_inputs_and_keeps_the_message() -> None:
    event = events.parse_text(json.dumps({"type": "execution_error", "data": {
        "prompt_id": "7a94468d", "node_id": "2", "node_type": "SaveImage", "executed": [],
        "exception_message": "**** ERROR: Saving image outside the output folder is not "
                             "allowed.\n full_output_folder: /srv/comfy\n",
        "exception_type": "Exception",
        "traceback": ['  File ".../execution.py", line 496, in execute\n'],
        "current_inputs": {"images": ["tensor([[[[0., 0., 0.]]]])"]},
        "current_outputs": ["2", "1"], "timestamp": 1796204674749}}))
    assert isinstance(event, events.ExecutionError)
    assert (event.node_id, event.node_type, event.exception_type) == ("2", "SaveImage",
                                                                      "Exception")
    assert event.exception_message.startswith("**** ERROR: Saving image outside")
    assert "current_inputs" not in repr(event)


def test_execution_interrupted() -> None:
    event = events.parse_text(json.dumps({"type": "execution_interrupted", "data": {
        "prompt_id": "0e408561", "node_id": "12", "node_type": "ImageBlur",
        "executed": ["11", "10", "1"], "timestamp": 1796204716071}}))
    assert event == events.ExecutionInterrupted(
        "0e408561", "12", "ImageBlur", ("11", "10", "1"), 1796204716071
    )


def test_unknown_types_are_kept_not_fatal() -> None:
    event = events.parse_text('{"type":"crystools.monitor","data":{"cpu_utilization":3}}')
    assert isinstance(event, events.Unknown) and event.type == "crystools.monitor"
    assert event.raw["data"]["cpu_utilization"] == 3
    assert isinstance(events.parse_text('["not", "a", "message"]'), events.Unknown)


def test_text_that_is_not_json_is_a_protocol_error() -> None:
    with pytest.raises(errors.BackendProtocolError):
        events.parse_text("<html>proxy error</html>")


def test_malformed_known_message_is_a_protocol_error() -> None:
    with pytest.raises(errors.BackendProtocolError, match="malformed progress"):
        events.parse_text('{"type":"progress","data":{"value":"x","max":2}}')


PNG = bytes.fromhex("89504e470d0a1a0a") + b"rest-of-png"


def test_legacy_preview_frame() -> None:
    event = events.parse_binary(bytes.fromhex("0000000100000002") + PNG)
    assert isinstance(event, events.Preview)
    assert (event.mime, event.image, event.prompt_id) == ("image/png", PNG, None)
    jpeg = events.parse_binary(struct.pack(">II", 1, 1) + b"\xff\xd8jpeg")
    assert isinstance(jpeg, events.Preview) and jpeg.mime == "image/jpeg"


def test_preview_with_metadata_frame() -> None:
    meta = json.dumps({"node_id": "2", "prompt_id": "784b", "display_node_id": "2",
                       "parent_node_id": None, "real_node_id": "2",
                       "image_type": "image/png"}).encode()
    event = events.parse_binary(struct.pack(">II", 4, len(meta)) + meta + PNG)
    assert isinstance(event, events.Preview)
    assert (event.prompt_id, event.node_id, event.mime, event.image) == (
        "784b", "2", "image/png", PNG)


def test_text_frame() -> None:
    node = b"17"
    event = events.parse_binary(struct.pack(">II", 3, len(node)) + node + "étape 3".encode())
    assert event == events.Text(None, node_id="17", text="étape 3")


@pytest.mark.parametrize("frame", [b"", b"\x00\x00", struct.pack(">I", 9) + b"x",
                                   struct.pack(">II", 4, 999) + b"{}"])
def test_odd_binary_frames_become_unknown(frame: bytes) -> None:
    assert isinstance(events.parse_binary(frame), events.Unknown)


def test_iterations_per_second_counts_the_busiest_node_between_its_first_and_last_step() -> None:
    def sample(at: float, node: str, value: int) -> results.ProgressSample:
        return results.ProgressSample(at=at, node=node, value=value, max=10)

    timings = results.Timings(progress=(
        sample(10.0, "7", 1), sample(10.5, "9", 1), sample(10.25, "7", 2),
        sample(11.0, "7", 5),
    ))
    assert timings.iterations_per_second() == pytest.approx(4 / 1.0)  # node 7: 4 steps in 1 s
    assert timings.iterations_per_second("9") is None  # one sample: no rate
    assert results.Timings().iterations_per_second() is None
