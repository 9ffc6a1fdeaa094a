"""The workflows shipped with comfyveil: NAME.json (API format) + NAME.toml (bindings).

Read them with `comfyveil.comfy.workflow.shipped()`; the format is documented there.
"""
