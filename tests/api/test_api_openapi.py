"""/v1/openapi.json: a valid OpenAPI 3.1 document of every /v1 route, and the jobs API's
answers matching it when fuzzed by schemathesis (a short run: a few examples a route)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp

from comfyveil.api import app as api_app
from tests.api.jobs_support import stack
from tests.lazy import lazy_import

validator = lazy_import("openapi_spec_validator")
schemathesis = lazy_import("schemathesis")
hypothesis = lazy_import("hypothesis")
checks = lazy_import("schemathesis.specs.openapi.checks")

# The routes that answer at once; the images API waits for its jobs to run, and a signed
# link needs a signature no fuzzer finds (both are in the document, checked by the validator).
FUZZED = re.compile(r"^/(jobs|models|openapi)")
EXAMPLES = 6  # a route; enough to cross its refusals and its answer


async def _document(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(url + "/v1/openapi.json") as r:
        assert r.status == 200 and r.content_type == "application/json"
        return await r.json()


def _template(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path)


async def test_the_document_is_valid_and_names_every_route(db, fake_comfy) -> None:
    async with stack(db, [fake_comfy], worker=False) as s:
        document = await _document(s.url)
    validator.validate(document)
    assert document["openapi"].startswith("3.1")
    served = set()
    for resource in api_app.build(s.settings, db).router.resources():
        info = resource.get_info()
        served.add(_template(info.get("path") or info.get("formatter", "")))
    documented = {_template(path) for path in document["paths"]}
    assert served == documented


def _fuzz(url: str, key: str, document: dict[str, Any]) -> int:
    """Each fuzzed route's answers checked against the document; how many were sent."""
    schema = schemathesis.openapi.from_dict(document)
    settings = hypothesis.settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(hypothesis.HealthCheck),
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    )
    sent = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if not FUZZED.match(operation.path):
            continue

        @settings
        @hypothesis.given(case=operation.as_strategy())
        def check(case: Any) -> None:
            nonlocal sent
            sent += 1
            case.call_and_validate(
                base_url=url + "/v1",
                headers={"Authorization": f"Bearer {key}"},
                timeout=30,
                # What a command takes (a prompt, images, which options) depends on the
                # command named: a request the document allows may be refused, in words.
                excluded_checks=[checks.positive_data_acceptance],
            )

        check()
    return sent


async def test_the_routes_answer_as_the_document_says_when_fuzzed(db, fake_comfy) -> None:
    async with stack(db, [fake_comfy], worker=False) as s:
        key, _user = await s.key()
        document = await _document(s.url)
        sent = await asyncio.to_thread(_fuzz, s.url, key, document)
    assert sent >= EXAMPLES * 5
