"""What a job's failure means: the error a worker gives up with when every GPU stays
offline, and whether the user of a failed job gets its quota back."""

from __future__ import annotations

from comfyveil.comfy import errors as comfy_errors
from comfyveil.comfy import pool


class AllGpusOffline(comfy_errors.ComfyError):
    """Every GPU stayed offline for as long as a job may wait for one."""

    transient = False

    def __init__(self, waited: float) -> None:
        span = f"{round(waited)} s" if waited < 90 else f"{round(waited / 60)} min"
        super().__init__(
            f"no GPU came back online within {span}, so the job was dropped; "
            "send the command again later",
            backend="any",
        )


def not_users_fault(exc: Exception) -> bool:
    """Whether a job that failed with `exc` should give its user's quota back: the GPU side
    let it down (a backend that went away or answered nonsense, a model or node found
    missing only when the prompt was posted, no GPU able to run it), as opposed to the
    workflow failing on the GPU with the values the user chose."""
    if isinstance(exc, comfy_errors.ComfyError) and exc.transient:
        return True
    if isinstance(exc, comfy_errors.WorkflowRejected):
        return bool(exc.missing_models or exc.missing_nodes)
    return isinstance(exc, pool.NoBackendCanRun | AllGpusOffline)
