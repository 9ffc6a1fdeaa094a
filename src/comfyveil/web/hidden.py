"""Publishing the web front end as a hidden service (not built yet)."""

from __future__ import annotations

import contextlib

from comfyveil import config


async def publish(settings: config.Settings, port: int, stack: contextlib.AsyncExitStack) -> str:
    raise config.ConfigError(
        "[web] hidden_service is not available in this version; publish the web port with "
        f"`comfyveil anon expose --target 127.0.0.1:{port} --name web`"
    )
