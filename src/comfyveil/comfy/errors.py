"""Errors raised while talking to a ComfyUI backend.

    ComfyError                    carries `backend` (its name) and `transient`
     ├── BackendUnreachable       refused, reset, DNS, proxy or timeout      (transient)
     │    └── BackendStopped      reached, then it went silent or hung up    (transient)
     ├── BackendProtocolError     an answer we cannot understand             (transient)
     │    └── AnswerTooLarge      an answer over its size cap                (transient)
     ├── OutputTooLarge           a file (or a job's files) over max_output_bytes
     ├── TooManyOutputs           a job lists more than max_outputs files
     ├── JobLost                  the backend no longer knows the prompt     (transient)
     ├── WorkflowRejected         400 from POST /prompt: validation failed   (permanent)
     ├── ExecutionFailed          an execution_error while running           (permanent)
     ├── Interrupted              the job was interrupted                    (permanent)
     ├── UploadRejected           POST /upload/image refused the file        (permanent)
     │    └── UploadTooLarge      413: over the backend's size limit
     ├── FileNotFound             GET /view has no such file                 (permanent)
     └── OutputDamaged            a result file whose container is damaged   (permanent)

`transient` says whether trying again (on this backend later or on another one) is
worth it. `str(error)` is one plain sentence for a chat user: it names things (a model
file, a node type, an input) but never holds a traceback, prompt text or a URL.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from comfyveil.comfy.limits import size_text
from comfyveil.errors import ComfyveilError

__all__ = [
    "AnswerTooLarge",
    "BackendProtocolError",
    "BackendStopped",
    "BackendUnreachable",
    "ComfyError",
    "ExecutionFailed",
    "FileNotFound",
    "Interrupted",
    "JobLost",
    "OutputDamaged",
    "OutputTooLarge",
    "TooManyOutputs",
    "UploadRejected",
    "UploadTooLarge",
    "WorkflowRejected",
]


class ComfyError(ComfyveilError):
    """The ComfyUI backend could not do what was asked."""

    transient: bool = False

    def __init__(
        self,
        message: str | None = None,
        *,
        backend: str = "comfyui",
        transient: bool | None = None,
    ) -> None:
        self.backend = backend
        if transient is not None:
            self.transient = transient
        super().__init__(message)


class BackendUnreachable(ComfyError):
    """The ComfyUI backend cannot be reached."""

    transient = True

    def __init__(self, message: str | None = None, *, backend: str = "comfyui") -> None:
        super().__init__(message or f"backend {backend} cannot be reached", backend=backend)


class BackendStopped(BackendUnreachable):
    """The backend was reached, then stopped answering or hung up part way.

    The message says during what ("during the upload"), never "cannot be reached".
    """

    def __init__(
        self,
        during: str,
        *,
        backend: str = "comfyui",
        broke: bool = False,
        message: str | None = None,
    ) -> None:
        self.during = during
        what = "broke off the connection" if broke else "stopped answering"
        super().__init__(message or f"backend {backend} {what} {during}", backend=backend)


class BackendProtocolError(ComfyError):
    """The ComfyUI backend sent an answer comfyveil does not understand."""

    transient = True


class AnswerTooLarge(BackendProtocolError):
    """An answer (JSON, an error page) was larger than anything a real backend sends."""

    def __init__(self, what: str, limit: int, *, backend: str = "comfyui") -> None:
        self.limit = limit
        super().__init__(
            f"backend {backend} sent an answer to {what} larger than {size_text(limit)}",
            backend=backend,
        )


class OutputTooLarge(ComfyError):
    """A backend sent more bytes of output than `[limits] max_output_bytes`."""

    def __init__(self, limit: int, *, backend: str = "comfyui", together: bool = False) -> None:
        self.limit = limit
        if together:
            text = f"backend {backend} sent more than {size_text(limit)} of files for one job"
        else:
            text = f"backend {backend} sent a file larger than {size_text(limit)}"
        super().__init__(text, backend=backend)


class TooManyOutputs(ComfyError):
    """A job lists more files than `[limits] max_outputs`."""

    def __init__(self, count: int, limit: int, *, backend: str = "comfyui") -> None:
        self.count = count
        self.limit = limit
        super().__init__(
            f"backend {backend} listed {count} files for one job, more than the {limit} allowed",
            backend=backend,
        )


class JobLost(ComfyError):
    """The backend no longer knows the job (it probably restarted)."""

    transient = True

    def __init__(self, prompt_id: str, *, backend: str = "comfyui") -> None:
        self.prompt_id = prompt_id
        super().__init__(
            f"backend {backend} no longer knows the job (it was probably restarted)",
            backend=backend,
        )


class ExecutionFailed(ComfyError):
    """The workflow failed while running on the backend."""

    def __init__(
        self,
        *,
        backend: str = "comfyui",
        prompt_id: str | None = None,
        node_id: str | None = None,
        node_type: str | None = None,
        exception_type: str | None = None,
        exception_message: str = "",
    ) -> None:
        self.prompt_id = prompt_id
        self.node_id = node_id
        self.node_type = node_type
        self.exception_type = exception_type
        self.exception_message = exception_message
        first = _first_line(exception_message) or "no reason given"
        where = f"node {node_id} ({node_type})" if node_id else "the workflow"
        super().__init__(f"{where} failed on backend {backend}: {first}", backend=backend)


class Interrupted(ComfyError):
    """The job was interrupted."""

    def __init__(
        self,
        *,
        backend: str = "comfyui",
        prompt_id: str | None = None,
        node_id: str | None = None,
        node_type: str | None = None,
    ) -> None:
        self.prompt_id = prompt_id
        self.node_id = node_id
        self.node_type = node_type
        super().__init__(f"the job was interrupted on backend {backend}", backend=backend)


class UploadRejected(ComfyError):
    """The backend refused the uploaded file."""


class UploadTooLarge(UploadRejected):
    """The file is larger than the backend accepts."""

    def __init__(self, limit: int | None, *, backend: str = "comfyui") -> None:
        self.limit = limit
        if limit:
            size = f"{limit / (1024 * 1024):.1f} MB".replace(".0 MB", " MB")
            msg = f"the file is larger than backend {backend} accepts (limit {size})"
        else:
            msg = f"the file is larger than backend {backend} accepts"
        super().__init__(msg, backend=backend)


class FileNotFound(ComfyError):
    """The backend has no such file."""


class OutputDamaged(ComfyError):
    """A result file's container is damaged or crafted, so its metadata cannot be told
    from its pixels. Permanent: the same backend would send the same file again."""

    def __init__(self, *, backend: str = "comfyui") -> None:
        super().__init__(f"backend {backend} sent a damaged file", backend=backend)


# --- workflow validation (400 from POST /prompt) -----------------------------------

_NOT_IN_LIST = re.compile(r"^\s*[^:]+:\s*'(?P<value>.*)' not in ")
_MISSING_CLASS = re.compile(r"node (?P<name>.+?) does not exist")
_MODEL_INPUT = re.compile(r"_name\d*$")  # ckpt_name, unet_name, clip_name1, lora_name ...
_MISSING_IMAGE = re.compile(r"Invalid image file:\s*(?P<name>.+)$")


class WorkflowRejected(ComfyError):
    """The backend rejected the workflow."""

    def __init__(
        self,
        error: Mapping[str, Any] | None,
        node_errors: Mapping[str, Any] | None,
        *,
        backend: str = "comfyui",
    ) -> None:
        self.error: dict[str, Any] = dict(error or {})
        self.node_errors: dict[str, Any] = dict(node_errors or {})
        self.missing_models: list[str] = []
        self.missing_nodes: list[str] = []
        self.missing_images: list[str] = []
        problems: list[str] = []
        self._collect(backend, problems)
        if not problems:
            message = _first_line(str(self.error.get("message") or "")) or "validation failed"
            details = _first_line(str(self.error.get("details") or ""))
            problems.append(f"backend {backend} rejected the workflow: {message}")
            if details:
                problems[-1] += f" ({details})"
        super().__init__("; ".join(problems), backend=backend)

    def _collect(self, backend: str, problems: list[str]) -> None:
        if self.error.get("type") == "invalid_prompt":
            found = _MISSING_CLASS.search(str(self.error.get("message") or ""))
            if found:
                self.missing_nodes.append(found["name"])
        for node_id, entry in self.node_errors.items():
            if not isinstance(entry, Mapping):
                continue
            class_type = str(entry.get("class_type") or "?")
            for err in entry.get("errors") or ():
                if isinstance(err, Mapping):
                    text = self._describe(str(node_id), class_type, err)
                    if text:
                        problems.append(text)
        for model in self.missing_models:
            problems.insert(0, f"model file {model} is not installed on backend {backend}")
        for node in self.missing_nodes:
            problems.insert(0, f"node type {node} is not installed on backend {backend}")
        for image in self.missing_images:
            problems.append(f"input image {image} is missing on backend {backend}")

    def _describe(self, node_id: str, class_type: str, err: Mapping[str, Any]) -> str | None:
        kind = err.get("type")
        details = str(err.get("details") or "")
        extra_info = err.get("extra_info")
        extra: Mapping[str, Any] = extra_info if isinstance(extra_info, Mapping) else {}
        input_name = str(extra.get("input_name") or details.split(":")[0].split(",")[0])
        if kind == "value_not_in_list" and _MODEL_INPUT.search(input_name):
            value = extra.get("received_value")
            if value is None:
                found = _NOT_IN_LIST.match(details)
                value = found["value"] if found else None
            if value is not None and str(value) not in self.missing_models:
                self.missing_models.append(str(value))
            return None
        if kind == "custom_validation_failed":
            found = _MISSING_IMAGE.search(details)
            if found:
                name = found["name"].strip()
                if name not in self.missing_images:
                    self.missing_images.append(name)
                return None
        message = _first_line(str(err.get("message") or "invalid value"))
        if kind in ("value_smaller_than_min", "value_bigger_than_max", "required_input_missing"):
            return f"{input_name}: {message} (node {node_id}, {class_type})"
        if kind == "value_not_in_list":
            return f"{_first_line(details) or input_name}: {message} (node {node_id}, {class_type})"
        text = _first_line(details)
        return f"{message}: {text} (node {node_id}, {class_type})" if text else (
            f"{message} (node {node_id}, {class_type})"
        )


def _first_line(text: str, limit: int = 300) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""
