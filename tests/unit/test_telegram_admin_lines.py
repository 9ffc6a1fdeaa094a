"""The chat's /backends lines for what a GPU lacks."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from comfyveil.comfy import workflow
from comfyveil.telegram import admin


def test_backends_names_every_command_a_gpu_cannot_run_listed_in_toml_or_not() -> None:
    """A command whose model files its TOML does not list used to be left out of
    /backends (the web's backends page showed it): it is named, with its files."""
    shipped = workflow.find("f")
    bare = dataclasses.replace(shipped, name="my_flux", command="myflux", models=())
    missing = ["model file flux1-schnell.safetensors (diffusion_models) is not installed"]
    backend = SimpleNamespace(object_info={}, problems=lambda wf: list(missing))
    entries = [
        SimpleNamespace(name="f", workflow=shipped),
        SimpleNamespace(name="myflux", workflow=bare),
    ]
    text = "\n".join(admin._install_lines(backend, entries))
    assert "/f: <code>flux1-schnell.safetensors</code>" in text
    assert "comfyveil models install f" in text
    assert "/myflux: <code>flux1-schnell.safetensors</code>" in text
    assert "put them on the GPU host yourself" in text
