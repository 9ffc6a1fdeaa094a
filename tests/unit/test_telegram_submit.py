"""Building a job's values from a command, the user's settings and the workflow."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from comfyveil.comfy import workflow
from comfyveil.desk import options, registry
from comfyveil.telegram import callbacks_data, commands, parse, submit


def entry(command: str) -> registry.Entry:
    wf = workflow.find(command)
    row = SimpleNamespace(title=wf.title, description=wf.description)
    return registry.Entry(command, row, wf)  # type: ignore[arg-type]


def parsed(e: registry.Entry, text: str) -> parse.ParsedCommand:
    result = parse.parse(text, e.options, negative_allowed=e.negative_allowed)
    assert result is not None
    return result


def test_options_override_settings_which_override_defaults() -> None:
    f = entry("f")
    prefs = {"ar": "16:9", "steps": 50, "seed_mode": "fixed", "seed": 5}
    values, as_file = submit.build_values(f, parsed(f, "/f a fox"), prefs)
    assert values == {"width": 1360, "height": 768, "steps": 8, "seed": 5, "prompt": "a fox"}
    assert as_file is None
    values, as_file = submit.build_values(
        f, parsed(f, "/f a fox --ar 1:1 --steps 2 --seed 9 --file"), prefs
    )
    checked = f.workflow.validate(values)
    assert (checked["width"], checked["height"], checked["steps"], checked["seed"]) == (
        1024, 1024, 2, 9)
    assert as_file is True


def test_sizes_respect_the_workflow_bounds() -> None:
    f = entry("f")
    width, height = submit.size_for(f.workflow, "1:4")
    assert (width, height) == (512, 2048)
    assert width % 16 == 0


def test_edit_workflow_gets_an_image_placeholder_and_refuses_ar() -> None:
    qwen = entry("qwen")
    values, _ = submit.build_values(qwen, parsed(qwen, "/qwen make it night --no blur"), {})
    assert values["image"] == submit.IMAGE_PLACEHOLDER
    assert values["negative"] == "blur"
    qwen.workflow.validate(values)  # complete: nothing required is missing
    with pytest.raises(parse.ParseError, match="--ar cannot be used"):
        submit.build_values(qwen, parsed(qwen, "/qwen x --ar 16:9"), {})


def test_help_shows_defaults_from_the_graph() -> None:
    help_ = entry("f").help()
    steps = next(o for o in help_.options if o.name == "steps")
    assert (steps.minimum, steps.maximum, steps.default) == (1, 8, 4)
    assert [o.name for o in help_.options][:2] == ["seed", "steps"]


def test_callback_data_round_trips_within_telegram_limits() -> None:
    job = "3f2a9c1d-0000-4000-8000-000000000001"
    for data in (callbacks_data.again(job), callbacks_data.edit(job, 2),
                 callbacks_data.as_file(job, 0), callbacks_data.setting("ar", "16:9")):
        assert len(data.encode()) <= 64
        assert callbacks_data.parse(data) is not None
    press = callbacks_data.parse(callbacks_data.edit(job, 2))
    assert press is not None and str(press.job_id) == job and press.index == 2
    assert callbacks_data.parse("set:ar:16:9") == callbacks_data.Press("set", key="ar",
                                                                        value="16:9")
    assert callbacks_data.parse("again:not-a-uuid") is None


def test_settings_buttons_only_accept_offered_values() -> None:
    assert commands.settings_change("ar", "16:9", {}) == ({"ar": "16:9"}, [])
    assert commands.settings_change("ar", "", {"ar": "1:1"}) == ({}, ["ar"])
    changes, _ = commands.settings_change("seed", "fixed", {})
    assert changes["seed_mode"] == "fixed" and isinstance(changes["seed"], int)
    with pytest.raises(Exception, match="not offered"):
        commands.settings_change("steps", "999", {})


def test_help_gives_an_options_own_translation_then_the_catalogs() -> None:
    from comfyveil import i18n

    wf = workflow.find("f")
    text = wf.source.read_text()  # type: ignore[union-attr]
    steps_description = wf.params["steps"].description
    assert steps_description
    mine = workflow.loads("mine", text.replace(
        f'description = "{steps_description}"',
        f'description.default = "{steps_description}"\ndescription.tr = "adım sayısı (kendi)"',
    ), wf.source.with_suffix(".json").read_text())  # type: ignore[union-attr]
    row = SimpleNamespace(title=mine.title, description=mine.description)
    own = registry.Entry("f", row, mine)  # type: ignore[arg-type]

    def described(e: registry.Entry, name: str) -> str:
        return next(o.description for o in e.help().options if o.name == name)

    with i18n.using("tr"):
        assert described(own, "steps") == "adım sayısı (kendi)"
        # no own translation: the catalog's, for a shipped text
        assert described(entry("f"), "steps") == i18n._(steps_description) != steps_description
    with i18n.using("en"):
        assert described(own, "steps") == steps_description


def test_help_shows_no_default_for_a_seed_that_is_drawn_each_run() -> None:
    """/help said "default 1" for an operator's `[params.seed] type = "int", default = 1`,
    while each run draws its own seed."""
    from pathlib import Path

    toml = Path(__file__).parents[1] / "data" / "workflows" / "seeded.toml"
    wf = workflow.load(toml)
    row = SimpleNamespace(title=wf.title, description=wf.description)
    help_ = registry.Entry("seeded", row, wf).help()  # type: ignore[arg-type]
    seed = next(o for o in help_.options if o.name == "seed")
    assert seed.default is None


def _small_model(minimum: int, maximum: int = 2048) -> workflow.Workflow:
    """/f as a small model would have it: a 64x64 default and sides from `minimum`."""
    import dataclasses
    import json

    f = workflow.find("f")
    graph = json.loads(json.dumps(f.graph, default=dict))
    params = dict(f.params)
    for name in ("width", "height"):
        params[name] = dataclasses.replace(params[name], min=minimum, max=maximum, step=8)
        target = params[name].targets[0]
        graph[target.node]["inputs"][target.input] = 64
    return dataclasses.replace(f, graph=graph, params=params)


def test_an_aspect_ratio_a_bound_would_bend_is_fitted_within_the_bounds() -> None:
    """21:9 with a 64 px minimum: both sides move (152x64), not just the short one (that
    gave 96x64, 3:2, without a word)."""
    width, height = submit.size_for(_small_model(64), "21:9")
    assert (width, height) == (152, 64)
    width, height = submit.size_for(_small_model(64), "9:21")
    assert (width, height) == (64, 152)


def test_an_aspect_ratio_no_size_can_keep_is_refused_in_words() -> None:
    with pytest.raises(parse.ParseError, match="does not fit the sizes /f can make"):
        submit.size_for(_small_model(64, maximum=96), "4:1")


def test_the_jobs_api_fits_an_aspect_ratio_as_the_chat_does() -> None:
    """The jobs API's options by name follow the chat's one rule: a bound bends neither the
    ratio (152x64, not 96x64) nor, where no size keeps it, goes by without a word."""
    f = entry("f")
    small = registry.Entry("f", f.command, _small_model(64))
    values = options.values_for(small, "a fox", {"ar": "21:9"})
    assert (values["width"], values["height"]) == (152, 64)
    tight = registry.Entry("f", f.command, _small_model(64, maximum=96))
    with pytest.raises(options.OptionError, match="does not fit the sizes /f can make") as err:
        options.values_for(tight, "a fox", {"ar": "4:1"})
    assert err.value.param == "ar"
