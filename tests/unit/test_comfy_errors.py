"""The sentences comfy errors show to chat users (400 shapes from notes §2)."""

from __future__ import annotations

from comfyveil.comfy import errors
from comfyveil.comfy.events import ExecutionError, ExecutionInterrupted
from comfyveil.comfy.results import RunResult
from comfyveil.errors import ComfyveilError


def _failed(node_id: str, class_type: str, *errs: dict[str, object]) -> dict[str, object]:
    return {node_id: {"errors": list(errs), "dependent_outputs": ["9"],
                      "class_type": class_type}}


ENVELOPE = {"type": "prompt_outputs_failed_validation",
            "message": "Prompt outputs failed validation", "details": "", "extra_info": {}}


def test_missing_model_file_named_from_details() -> None:
    err = errors.WorkflowRejected(ENVELOPE, _failed("1", "UNETLoader", {
        "type": "value_not_in_list", "message": "Value not in list",
        "details": "unet_name: 'flux1-schnell.safetensors' not in []",
        "extra_info": {"input_name": "unet_name", "input_config": [[]],
                       "received_value": "flux1-schnell.safetensors"}}), backend="gpu0")
    assert err.missing_models == ["flux1-schnell.safetensors"]
    assert str(err) == "model file flux1-schnell.safetensors is not installed on backend gpu0"
    assert err.transient is False
    assert isinstance(err, ComfyveilError)


def test_missing_model_without_extra_info_and_several_problems() -> None:
    node_errors = {
        **_failed("1", "DualCLIPLoader",
                  {"type": "value_not_in_list", "message": "Value not in list",
                   "details": "clip_name2: 't5xxl_fp16.safetensors' not in (list of length 30)"}),
        **_failed("7", "KSampler",
                  {"type": "value_smaller_than_min", "message": "Value -5 smaller than min of 1",
                   "details": "steps", "extra_info": {"input_name": "steps"}}),
    }
    err = errors.WorkflowRejected(ENVELOPE, node_errors, backend="gpu1")
    assert err.missing_models == ["t5xxl_fp16.safetensors"]
    assert str(err) == ("model file t5xxl_fp16.safetensors is not installed on backend gpu1; "
                        "steps: Value -5 smaller than min of 1 (node 7, KSampler)")


def test_a_combo_that_is_not_a_model_is_not_called_a_model() -> None:
    err = errors.WorkflowRejected(ENVELOPE, _failed("4", "ImageScale", {
        "type": "value_not_in_list", "message": "Value not in list",
        "details": "upscale_method: 'nope' not in ['nearest-exact', 'bilinear']",
        "extra_info": {"input_name": "upscale_method", "received_value": "nope"}}))
    assert err.missing_models == []
    assert str(err) == ("upscale_method: 'nope' not in ['nearest-exact', 'bilinear']: "
                        "Value not in list (node 4, ImageScale)")


def test_unknown_node_type() -> None:
    err = errors.WorkflowRejected(
        {"type": "invalid_prompt", "message": "Cannot execute because node NoSuchNode does not "
         "exist.", "details": "Node ID '#1'", "extra_info": {}}, {}, backend="gpu0")
    assert err.missing_nodes == ["NoSuchNode"]
    assert str(err) == "node type NoSuchNode is not installed on backend gpu0"


def test_missing_input_image() -> None:
    err = errors.WorkflowRejected(ENVELOPE, _failed("3", "LoadImage", {
        "type": "custom_validation_failed", "message": "Custom validation failed for node",
        "details": "image - Invalid image file: photo.png",
        "extra_info": {"input_name": "image"}}), backend="gpu0")
    assert err.missing_images == ["photo.png"]
    assert str(err) == "input image photo.png is missing on backend gpu0"


def test_required_input_and_generic_envelope() -> None:
    err = errors.WorkflowRejected(ENVELOPE, _failed("1", "EmptyImage", {
        "type": "required_input_missing", "message": "Required input is missing",
        "details": "width", "extra_info": {"input_name": "width"}}))
    assert str(err) == "width: Required input is missing (node 1, EmptyImage)"
    no_outputs = errors.WorkflowRejected(
        {"type": "prompt_no_outputs", "message": "Prompt has no outputs", "details": ""}, {},
        backend="gpu2")
    assert str(no_outputs) == "backend gpu2 rejected the workflow: Prompt has no outputs"


def test_execution_failed_shows_first_line_only() -> None:
    result = RunResult("p1", "gpu0", "error", error=ExecutionError(
        "p1", "2", "SaveImage", "**** ERROR: Saving image outside the output folder is not "
        "allowed.\n full_output_folder: /srv/comfy", "Exception",
        traceback=('  File "execution.py", line 496\n',)))
    try:
        result.raise_for_status()
    except errors.ExecutionFailed as exc:
        assert str(exc) == ("node 2 (SaveImage) failed on backend gpu0: **** ERROR: Saving "
                            "image outside the output folder is not allowed.")
        assert "execution.py" not in str(exc) and "/srv" not in str(exc)
        assert exc.transient is False and exc.node_type == "SaveImage"
    else:
        raise AssertionError("raise_for_status did not raise")


def test_interrupted_and_transient_kinds() -> None:
    result = RunResult("p1", "gpu0", "interrupted",
                       interruption=ExecutionInterrupted("p1", "12", "ImageBlur"))
    try:
        result.raise_for_status()
    except errors.Interrupted as exc:
        assert str(exc) == "the job was interrupted on backend gpu0"
        assert exc.node_id == "12"
    assert RunResult("p1", "gpu0", "success").raise_for_status().status == "success"
    assert errors.BackendUnreachable(backend="gpu0").transient is True
    assert errors.JobLost("p1", backend="gpu0").transient is True
    assert str(errors.JobLost("p1", backend="gpu0")) == (
        "backend gpu0 no longer knows the job (it was probably restarted)")
    assert errors.UploadTooLarge(100 * 1024 * 1024, backend="g").limit == 104857600
    assert "limit 100 MB" in str(errors.UploadTooLarge(100 * 1024 * 1024, backend="g"))
