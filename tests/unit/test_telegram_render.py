"""What users read in chat: status lines, captions, help and history, in Telegram HTML."""

from __future__ import annotations

from datetime import datetime

import pytest

from comfyveil.telegram import render
from tests.fakes import telegram as fake_telegram

JOB_ID = "3f2a9c1d-7e55-4b1a-9c3e-0123456789ab"


def shown(html_text: str) -> str:
    """The text as Telegram displays it (and a check that Telegram would accept it)."""
    text, _entities = fake_telegram.parse_html(html_text)
    return text


def job(**changes: object) -> render.JobView:
    base: dict[str, object] = {"id": JOB_ID, "command": "f", "status": "queued"}
    base.update(changes)
    return render.JobView(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("view", "expected"),
    [
        (job(position=3, eta_s=40), "Queued #3 · about 40 s"),
        (job(position=1, eta_s=200), "Queued · next in line · about 3 min"),
        (job(position=12, eta_s=4000), "Queued #12 · about 1 h 7 min"),
        (job(position=2), "Queued #2"),
        (job(position=0, eta_s=4.2), "Starting… · about 4.2 s"),
        (
            job(status="running", backend="gpu0", progress=0.45, step=9, steps=20),
            "Running on gpu0 · 45% · step 9/20",
        ),
        (job(status="running", backend="gpu1"), "Running on gpu1"),
        (job(status="running", progress=1.7), "Running · 100%"),
        (job(status="succeeded", seed=42, elapsed_s=3.14), "/f · seed 42 · 3.1 s"),
        (job(status="cancelled"), "Cancelled."),
    ],
)
def test_status_lines(view: render.JobView, expected: str) -> None:
    assert shown(render.status_text(view)) == expected


def test_failure_is_one_plain_sentence() -> None:
    failed = job(status="failed", error="No GPU has the model flux1-schnell.safetensors.")
    assert shown(render.status_text(failed)) == "No GPU has the model flux1-schnell.safetensors."


def test_failure_never_shows_a_traceback() -> None:
    trace = (
        "Traceback (most recent call last):\n"
        '  File "/app/worker.py", line 10, in run\n'
        "KeyError: 'prompt'"
    )
    assert shown(render.status_text(job(status="failed", error=trace))) == "The job failed."
    assert shown(render.status_text(job(status="failed"))) == "The job failed."


def test_failure_keeps_the_first_line_and_escapes_it() -> None:
    error = "The workflow failed on gpu0: <CLIPTextEncode> got & lost.\nsecond line " * 20
    text = render.status_text(job(status="failed", error=error))
    assert shown(text) == "The workflow failed on gpu0: <CLIPTextEncode> got & lost."
    long_error = "x" * 5000
    assert len(shown(render.status_text(job(status="failed", error=long_error)))) == 300


def test_caption_escapes_and_fits() -> None:
    view = job(status="succeeded", command="wan", seed=7, elapsed_s=125)
    assert shown(render.caption(view)) == "/wan · seed 7 · 2 min"
    assert shown(render.caption(job(status="succeeded"))) == "/f"


def test_short_id_is_what_cancel_accepts() -> None:
    from comfyveil.telegram import parse

    ref = render.short_id(JOB_ID)
    assert ref == "3f2a9c1d"
    parsed = parse.parse(f"/cancel #{ref}", {})
    assert parsed is not None and JOB_ID.startswith(parsed.target_job or "-")


def test_help_lists_commands_options_and_bounds() -> None:
    commands = [
        render.CommandHelp(
            name="f",
            title="Flux Schnell",
            description="Fast text to image.",
            options=[
                render.OptionHelp("steps", "sampling steps", 1, 8, 4),
                render.OptionHelp("seed", "random seed", minimum=0.0),
                render.OptionHelp("size", "size", default="big"),  # no description of its own
            ],
            negative=True,
        ),
        render.CommandHelp(name="qwen", title="Qwen Image Edit <2509>", takes_image=True),
    ]
    text = shown(render.help_text(commands))
    assert "/f Flux Schnell\nFast text to image." in text
    assert "--steps sampling steps (1–8), default 4" in text
    assert "--seed random seed (at least 0)" in text
    assert "  --size, default big" in text and "--size size" not in text
    assert "/qwen Qwen Image Edit <2509>" in text
    assert "reply to a photo" in text
    assert "--no blurry, text" in text


def test_help_without_commands() -> None:
    assert "No commands are enabled" in shown(render.help_text([]))


def test_help_with_many_commands_stays_in_one_message() -> None:
    options = [render.OptionHelp(f"opt{i}", "a setting " * 8, 0, 100, 50) for i in range(8)]
    commands = [
        render.CommandHelp(name=f"cmd{i}", title=f"Workflow {i}", options=options)
        for i in range(40)
    ]
    html_text = render.help_text(commands)
    text = shown(html_text)
    assert len(html_text) <= render.MAX_MESSAGE_CHARS
    assert "/cmd0 Workflow 0" in text
    assert "Also: /cmd" in text
    assert "/cmd39 Workflow 39" not in text


def test_history_lines() -> None:
    entries = [
        render.HistoryEntry(
            id=JOB_ID,
            command="f",
            prompt="a <red> fox &\n in   snow",
            status="succeeded",
            created_at=datetime(2026, 3, 5, 14, 7),
            seed=42,
            elapsed_s=3.1,
        ),
        render.HistoryEntry(
            id="00000000-0000-4000-8000-000000000001",
            command="qwen",
            prompt="night " * 40,
            status="failed",
            created_at=datetime(2026, 3, 4, 9, 0),
        ),
    ]
    lines = shown(render.history_text(entries)).splitlines()
    assert lines[0] == "Your last jobs"
    assert lines[1] == "#3f2a9c1d /f a <red> fox & in snow"
    assert lines[2] == "  05 Mar 14:07 · done · seed 42 · 3.1 s"
    assert lines[3].startswith("#00000000 /qwen night night")
    assert lines[3].endswith("…") and len(lines[3]) < 90
    assert lines[4] == "  04 Mar 09:00 · failed"


def test_history_empty_and_long() -> None:
    assert render.history_text([]) == "You have no jobs yet."
    many = [
        render.HistoryEntry(
            id=JOB_ID,
            command="f",
            prompt="&" * 60,
            status="queued",
            created_at=datetime(2026, 1, 1),
        )
    ] * 200
    html_text = render.history_text(many)
    assert len(html_text) <= render.MAX_MESSAGE_CHARS
    shown(html_text)


def test_durations() -> None:
    assert [render.duration(s) for s in (0.04, 9.96, 10, 89, 90, 3540, 3600, 3900)] == [
        "0.0 s", "10.0 s", "10 s", "89 s", "2 min", "59 min", "1 h", "1 h 5 min",
    ]  # fmt: skip


def test_the_help_example_uses_only_options_its_command_has() -> None:
    """/help's own example must not be refused (issue 23 item 8): a command without a seed,
    size or negative prompt gets an example without --seed, --ar and --no."""
    solid = render.CommandHelp(
        name="solid", title="Solid colour", options=[render.OptionHelp("colour", "the colour")]
    )
    text = shown(render.help_text([solid]))
    assert "/solid a fox in snow." in text
    assert "--seed" not in text and "--ar" not in text and "--no" not in text
    assert "--file sends the full-quality file." in text
    flux = render.CommandHelp(
        name="f", title="Flux", options=[render.OptionHelp("seed", "seed")],
        negative=True, sized=True,
    )
    text = shown(render.help_text([flux]))
    assert "/f a fox in snow --seed 42 --ar 16:9." in text
    assert "--no blurry, text is the negative prompt" in text
