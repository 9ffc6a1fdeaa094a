"""Chat command parsing: what a user types becomes a prompt and options, or one sentence."""

from __future__ import annotations

import pytest

from comfyveil import errors
from comfyveil.telegram import parse

FLUX = {"seed": "random seed", "steps": "sampling steps", "cfg_scale": "guidance"}


def test_prompt_and_options_in_both_spellings() -> None:
    parsed = parse.parse("/f a fox in snow --seed 42 --steps=4 --ar 16:9", FLUX)
    assert parsed == parse.ParsedCommand(
        command="f",
        prompt="a fox in snow",
        negative=None,
        options={"seed": "42", "steps": "4", "ar": "16:9"},
        target_job=None,
    )


def test_options_may_come_before_and_between_prompt_words() -> None:
    parsed = parse.parse("/F --seed 7 a red   fox --steps 4 in snow", FLUX)
    assert parsed is not None
    assert parsed.command == "f"
    assert parsed.prompt == "a red fox in snow"
    assert parsed.options == {"seed": "7", "steps": "4"}


def test_negative_prompt_runs_to_the_next_option() -> None:
    parsed = parse.parse("/sd3 a castle --no blurry, text,  watermark --steps 20", FLUX)
    assert parsed is not None
    assert parsed.prompt == "a castle"
    assert parsed.negative == "blurry, text, watermark"
    assert parsed.options == {"steps": "20"}


def test_negative_prompt_refused_when_the_workflow_has_none() -> None:
    with pytest.raises(parse.ParseError, match="/f has no negative prompt"):
        parse.parse("/f a fox --no blur", FLUX, negative_allowed=False)


def test_quoted_values_keep_their_spaces() -> None:
    parsed = parse.parse(
        "/f a fox --style \"oil painting\" --lora 'my lora'", {"style": "style", "lora": "lora"}
    )
    assert parsed is not None
    assert parsed.options == {"style": "oil painting", "lora": "my lora"}
    assert parsed.prompt == "a fox"
    typographic = parse.parse("/f fox --style “oil painting”", {"style": "style"})
    assert typographic is not None and typographic.options == {"style": "oil painting"}


def test_unclosed_quote_is_explained() -> None:
    with pytest.raises(parse.ParseError, match="quote after --style is never closed"):
        parse.parse('/f fox --style "oil painting', {"style": "style"})


def test_phone_dashes_and_case_and_underscores_are_accepted() -> None:
    parsed = parse.parse("/f fox —seed 3 --CFG-scale 1.5", FLUX)
    assert parsed is not None
    assert parsed.options == {"seed": "3", "cfg_scale": "1.5"}


def test_unknown_option_lists_what_is_allowed_and_suggests() -> None:
    with pytest.raises(parse.ParseError) as raised:
        parse.parse("/f a fox --sed 42", FLUX)
    message = str(raised.value)
    assert message.startswith("/f has no option --sed. Did you mean --seed?")
    for name in ("--seed", "--steps", "--cfg_scale", "--ar", "--file", "--no"):
        assert name in message
    assert isinstance(raised.value, errors.UsageError)
    assert "\n" not in message


def test_option_without_value_and_given_twice() -> None:
    with pytest.raises(parse.ParseError, match="--seed needs a value"):
        parse.parse("/f a fox --seed", FLUX)
    with pytest.raises(parse.ParseError, match="--seed is given twice"):
        parse.parse("/f a fox --seed 1 --seed 2", FLUX)


def test_file_flag_takes_no_value_unless_yes_or_no() -> None:
    parsed = parse.parse("/f --file a fox", FLUX)
    assert parsed is not None
    assert parsed.options == {"file": "yes"}
    assert parsed.prompt == "a fox"
    off = parse.parse("/f a fox --file off", FLUX)
    assert off is not None and off.options == {"file": "no"} and off.prompt == "a fox"


def test_bot_username_suffix_in_groups_and_private_chats() -> None:
    ours = parse.parse("/f@MyBot a fox", FLUX, bot_username="mybot", in_group=True)
    assert ours is not None and ours.prompt == "a fox"
    assert parse.parse("/f@OtherBot a fox", FLUX, bot_username="MyBot", in_group=True) is None
    private = parse.parse("/f@OtherBot a fox", FLUX, bot_username="MyBot")
    assert private is not None and private.prompt == "a fox"


def test_text_that_is_not_a_command() -> None:
    assert parse.parse("a fox in snow", FLUX) is None
    assert parse.parse("/", FLUX) is None
    assert parse.parse("/f-x fox", FLUX) is None
    assert parse.split_command("  /help") == ("help", "")


def test_job_reference_as_first_word() -> None:
    short = parse.parse("/cancel #3F2A9C1D", {})
    assert short is not None and short.target_job == "3f2a9c1d" and short.prompt == ""
    uuid = "3f2a9c1d-0000-4000-8000-00000000abcd"
    full = parse.parse(f"/qwen {uuid} make it night", {})
    assert full is not None
    assert full.target_job == uuid and full.prompt == "make it night"
    year = parse.parse("/f 20240101 poster", FLUX)
    assert year is not None and year.target_job is None and year.prompt == "20240101 poster"


def test_prompt_required_and_length_limit() -> None:
    with pytest.raises(parse.ParseError, match=r"Write a prompt after /f, for example"):
        parse.parse("/f --seed 1", FLUX, require_prompt=True)
    with pytest.raises(parse.ParseError, match="10000 characters long; the limit is 2000"):
        parse.parse("/f " + "a" * 10_000, FLUX)
    assert parse.parse("/f", FLUX) == parse.ParsedCommand("f", "")


def test_the_prompt_length_limit_is_exact() -> None:
    at_limit = parse.parse("/f " + "a" * 300, FLUX, max_prompt_chars=300)
    assert at_limit is not None and len(at_limit.prompt) == 300
    with pytest.raises(parse.ParseError, match="301 characters long; the limit is 300"):
        parse.parse("/f " + "a" * 301, FLUX, max_prompt_chars=300)
    negative = parse.parse("/f fox --no " + "b" * 300, FLUX, max_prompt_chars=300)
    assert negative is not None and negative.negative == "b" * 300
    with pytest.raises(parse.ParseError, match="negative prompt is 301 characters long"):
        parse.parse("/f fox --no " + "b" * 301, FLUX, max_prompt_chars=300)


def test_bad_aspect_ratio_in_a_command() -> None:
    with pytest.raises(parse.ParseError, match="between 1:4 and 4:1"):
        parse.parse("/f fox --ar 10:1", FLUX)
    with pytest.raises(parse.ParseError, match="write it like 16:9"):
        parse.parse("/f fox --ar wide", FLUX)


@pytest.mark.parametrize(
    ("ar", "size"),
    [
        ("1:1", (1024, 1024)),
        ("16:9", (1360, 768)),
        ("9:16", (768, 1360)),
        ("3x2", (1248, 832)),
        ("4:1", (2048, 512)),
    ],
)
def test_aspect_to_size_keeps_pixels_and_multiples(ar: str, size: tuple[int, int]) -> None:
    width, height = parse.aspect_to_size(ar, 1024 * 1024)
    assert (width, height) == size
    assert width % 16 == 0 and height % 16 == 0
    assert 0.9 < width * height / (1024 * 1024) < 1.1


def test_aspect_to_size_other_multiple_and_refusals() -> None:
    assert parse.aspect_to_size("16:9", 512 * 512, multiple=64) == (704, 384)
    with pytest.raises(parse.ParseError, match="too extreme"):
        parse.aspect_to_size("1:5", 1024 * 1024)
    with pytest.raises(parse.ParseError, match="above zero"):
        parse.aspect_to_size("0:5", 1024 * 1024)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # A phone's dash or a single hyphen before a known option: that option was meant.
        ("/f a fox −seed 4", "Write options with two hyphens: --seed, not −seed."),
        ("/f a fox -steps 4", "Write options with two hyphens: --steps, not -steps."),
        # A flag's last word is its value, not the prompt's.
        ("/f hi --file maybe", "--file is yes or no, or nothing; not 'maybe'."),
    ],
)
def test_stray_words_are_refused_not_joined_to_the_prompt(text: str, message: str) -> None:
    with pytest.raises(parse.ParseError) as raised:
        parse.parse(text, FLUX)
    assert str(raised.value) == message
    # A hyphen inside the prompt stays the prompt's.
    kept = parse.parse("/f a blue-ish fox -5 degrees", FLUX)
    assert kept is not None and kept.prompt == "a blue-ish fox -5 degrees"


def test_words_for_a_command_that_takes_none_are_refused() -> None:
    with pytest.raises(parse.ParseError) as raised:
        parse.parse("/invert hi", {}, takes_prompt=False)
    assert str(raised.value) == "/invert takes no words, only its options: 'hi' would be lost."
    assert parse.parse("/invert --file", {}, takes_prompt=False) is not None


@pytest.mark.parametrize("word", ["--шаги", "--步数", "--گام", "—шаги"])
def test_an_option_in_any_script_that_is_not_one_is_refused_not_prompted(word: str) -> None:
    """`/f лиса --шаги 3` used to queue "лиса --шаги 3" as the prompt."""
    with pytest.raises(parse.ParseError) as caught:
        parse.parse(f"/f лиса {word} 3", FLUX)
    text = str(caught.value)
    assert text.startswith("/f has no option --") and "Allowed:" in text and "--steps" in text


def test_a_dash_inside_words_of_any_script_stays_in_the_prompt() -> None:
    parsed = parse.parse("/f лиса — рыжая, сине-зелёный фон", FLUX)
    assert parsed is not None and parsed.prompt == "лиса — рыжая, сине-зелёный фон"
