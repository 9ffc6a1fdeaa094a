"""The catalogs: complete, compilable, placeholders and markup kept; the language per task;
plural forms; right-to-left isolates."""

from __future__ import annotations

import asyncio
import re
import string

import pytest
from babel.messages.plurals import get_plural

from comfyveil import i18n
from comfyveil.i18n import _, n_
from comfyveil.locale import catalogs

LANGUAGES = list(i18n.LANGUAGES)
_TAG = re.compile(r"</?[a-z-]+>")


@pytest.fixture(scope="module")
def template():
    return catalogs.extract()


def _ids(catalog) -> set[str]:
    return {m.id if isinstance(m.id, str) else m.id[0] for m in catalog if m.id}


_PERCENT_FIELD = re.compile(r"%\((\w+)\)s")


def _fields(text: str) -> set[str]:
    """The named fields of `text`: Python's ``{n}`` (our code) and ``%(n)s`` (the pages,
    Jinja2's gettext); a field a translation adds or misspells fails at render time."""
    braces = {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
    return braces | set(_PERCENT_FIELD.findall(text))


def test_the_committed_template_is_what_the_code_marks(template) -> None:
    committed = catalogs.read(catalogs.TEMPLATE)
    assert _ids(committed) == _ids(template), "run: python -m comfyveil.locale.catalogs update"


@pytest.mark.parametrize("language", LANGUAGES)
def test_every_message_is_translated_in_every_catalog(language: str, template) -> None:
    catalog = catalogs.read(catalogs.po_path(language), language)
    assert _ids(template) <= _ids(catalog), "run: python -m comfyveil.locale.catalogs update"
    assert catalogs.untranslated(language) == []
    plural = get_plural(i18n.LANGUAGES[language])
    assert catalog.num_plurals == plural.num_plurals
    for message in catalog:
        if message.id and isinstance(message.id, tuple):
            assert len(message.string) == plural.num_plurals, message.id


@pytest.mark.parametrize("language", LANGUAGES)
def test_placeholders_and_markup_match_between_id_and_translation(language: str) -> None:
    catalog = catalogs.read(catalogs.po_path(language), language)
    for message in catalog:
        if not message.id:
            continue
        ids = message.id if isinstance(message.id, tuple) else (message.id,)
        strings = message.string if isinstance(message.string, tuple) else (message.string,)
        wanted = _fields(ids[0]) | _fields(ids[-1])
        for text in filter(None, strings):  # an empty one: the test above fails
            # A language with one plural form may leave the number out of the words.
            assert _fields(text) <= wanted and (_fields(text) >= _fields(ids[0]) or len(ids) > 1), (
                language,
                ids[0],
                text,
            )
            assert sorted(_TAG.findall(text)) == sorted(_TAG.findall(ids[0])), (
                language,
                ids[0],
                text,
            )


@pytest.mark.parametrize("language", LANGUAGES)
def test_every_catalog_compiles(language: str) -> None:
    i18n.translations.cache_clear()
    compiled = i18n.translations(language)
    assert compiled.info()["language"].lower().startswith(language)
    with i18n.using(language):
        assert _("What I can do")


def test_languages_resolve_from_telegram_codes_with_english_as_fallback() -> None:
    assert [i18n.resolve(c) for c in ("ru", "fa-IR", "zh-hans", "pt-br", None, "")] == [
        "ru",
        "fa",
        "zh",
        "en",
        "en",
        "en",
    ]
    with i18n.using("de"):
        assert _("What I can do") == "What I can do"
    with i18n.using("ru"):
        assert _("a text no catalog has") == "a text no catalog has"


def test_plural_forms_follow_each_language() -> None:
    with i18n.using("en"):
        assert [n_("{n} job", "{n} jobs", n) for n in (1, 2)] == ["{n} job", "{n} jobs"]
    # Russian has three forms, chosen by the last digits: 1, 2-4, 5-20 (and 11-14).
    ru = i18n.translations("ru")
    forms = {n: ru.plural(n) for n in (1, 2, 5, 11, 21, 22, 25)}  # type: ignore[attr-defined]
    assert forms == {1: 0, 2: 1, 5: 2, 11: 2, 21: 0, 22: 1, 25: 2}
    # Arabic has six; in Babel's formula form 4 is 100-102 (n % 100 <= 2), form 5 is 11-99.
    ar = i18n.translations("ar")
    assert [ar.plural(n) for n in (0, 1, 2, 3, 11, 100)] == [0, 1, 2, 3, 5, 4]  # type: ignore[attr-defined]


async def test_each_task_keeps_its_own_language() -> None:
    async def speak(code: str) -> str:
        i18n.set_language(code)
        await asyncio.sleep(0)
        return _("What I can do")

    texts = await asyncio.gather(speak("ru"), speak("zh"), speak("en"))
    assert texts == ["Что я умею", "我能做什么", "What I can do"]
    assert i18n.current() == "en"


def test_ltr_isolates_only_in_right_to_left_languages() -> None:
    with i18n.using("fa"):
        assert i18n.ltr("--ar 16:9") == "\u2066--ar 16:9\u2069"
        assert i18n.direction() == "rtl"
    with i18n.using("ru"):
        assert i18n.ltr("--ar 16:9") == "--ar 16:9"
        assert i18n.direction() == "ltr"


def test_rtl_keeps_a_step_count_and_options_in_order() -> None:
    from comfyveil.telegram import render

    view = render.JobView(
        id="x", command="f", status="running", backend="gpu0", progress=0.45, step=9, steps=20
    )
    with i18n.using("fa"):
        text = render.status_text(view)
        footer = render.help_footer(render.CommandHelp(
            "f", "Flux", options=[render.OptionHelp("seed", "seed")], sized=True))
    # One isolate around "9/20": two apart would read "20/9" in a right-to-left line.
    assert "\u20669/20\u2069" in text and "\u2066gpu0\u2069" in text
    assert "\u2066<code>/f " in footer and "--seed 42 --ar 16:9</code>\u2069" in footer


def test_no_gettext_call_hides_inside_an_f_string() -> None:
    """Babel cannot see a call inside an f-string: its text would never be translated."""
    hidden = re.compile(r"""f(["']).*\{[^}]*\b(?:_|n_|N_|ngettext|gettext)\(\s*["']""")
    for path in catalogs.PACKAGE.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            assert not hidden.search(line), f"{path.name}:{number}: {line.strip()}"


def test_messages_raised_in_english_are_said_in_the_readers_language() -> None:
    from comfyveil import policy
    from comfyveil.telegram import replies

    with i18n.using("ru"):
        assert replies.user_message(policy.PromptRefused()) == (
            "Этот бот не принимает такой запрос; ничего не поставлено в очередь."
        )
        # the worker's sentence, stored in English, shown in the job's language
        assert replies.sentence("waiting for a GPU") == "Ожидание GPU."
    with i18n.using("zh"):
        assert replies.sentence("waiting for a free GPU") == "等待空闲的 GPU。"


def test_the_all_gpus_offline_sentence_counts_in_the_readers_language() -> None:
    """The worker stores "no GPU came back online within 5 min" in English; users read
    the span with their language's plural (it used to stay English, "5 min")."""
    from comfyveil.desk import failures
    from comfyveil.worker.failures import AllGpusOffline

    def said(waited: float) -> str:
        return failures.sentence(str(AllGpusOffline(waited)))

    assert said(1).startswith("No GPU came back online within 1 second, so the job was")
    assert said(300).startswith("No GPU came back online within 5 minutes, so")
    with i18n.using("ru"):
        assert "за 1 секунду," in said(1)
        assert "за 3 секунды," in said(3)
        assert "за 45 секунд," in said(45)
        assert "за 2 минуты," in said(120) and "за 5 минут," in said(300)
        assert "GPU" in said(300) and "online" not in said(300)
    with i18n.using("ar"):
        assert "دقيقتين" in said(120)  # Arabic's dual: "two minutes" in one word


def test_a_bad_option_value_is_refused_in_the_readers_language() -> None:
    """`/f a fox --steps 99`: the workflow's own check (bounds, types, unknown options)
    speaks the reader's language; in Persian the option and numbers stay left to right."""
    from comfyveil.comfy import workflow
    from comfyveil.telegram import replies

    flux = workflow.find("f")

    def refusal(values: dict[str, object]) -> str:
        with pytest.raises(workflow.ParamError) as caught:
            flux.validate({"prompt": "a fox", **values})
        return replies.user_message(caught.value)

    assert refusal({"steps": 99}) == "Steps must be between 1 and 8 (got 99)."
    with i18n.using("ru"):
        assert refusal({"steps": 99}) == "Параметр steps должен быть от 1 до 8 (указано 99)."
        assert refusal({"prompt": "x" * 2001}) == (
            "Параметр prompt слишком длинный (2001 символ, не больше 2000)."
        )
    with i18n.using("es"):
        assert refusal({"steps": "abc"}) == "Steps debe ser un número entero (se recibió 'abc')."
    with i18n.using("fa"):
        said = refusal({"steps": 99})
        assert said.startswith(f"{i18n.LRI}steps{i18n.PDI} باید بین {i18n.LRI}1{i18n.PDI}")
        assert "must" not in said
        assert "--bogus" in refusal({"bogus": 1}) and "unknown" not in refusal({"bogus": 1})


@pytest.mark.parametrize("language", ["fa", "ar"])
def test_one_digit_system_per_page(language: str) -> None:
    """Numbers the code fills in (bounds, counts, sizes) are written 0-9, so the
    translations write theirs 0-9 too: never "۴ گام" beside "64" on one page."""
    from comfyveil.locale import catalogs

    native = re.compile("[\u06f0-\u06f9\u0660-\u0669]")
    catalog = catalogs.read(catalogs.po_path(language), language)
    mixed = []
    for message in catalog:
        strings = message.string if isinstance(message.string, tuple) else (message.string,)
        mixed += [text for text in strings if text and native.search(text)]
    assert mixed == []


def test_persian_says_seed_with_one_word_in_the_chat_and_on_the_web() -> None:
    """The chat said "بذر" and the web "سید" for the same seed."""
    import re

    from comfyveil.locale import catalogs

    borrowed = re.compile(r"(?<![\u0600-\u06FF\u200c])سید(?![\u0600-\u06FF\u200c])")
    said = []
    for message in catalogs.read(catalogs.po_path("fa"), "fa"):
        ids = message.id if isinstance(message.id, tuple) else (message.id,)
        strings = message.string if isinstance(message.string, tuple) else (message.string,)
        if message.id and any(re.search(r"\bseed\b", i, re.IGNORECASE) for i in ids):
            said += [s for s in strings if s]
    assert said and not [s for s in said if borrowed.search(s)]
    assert all("بذر" in s for s in said if "seed" not in s.lower()), said


@pytest.mark.parametrize(("language", "separator"), [("fa", "، "), ("ar", "، "), ("en", ", ")])
def test_lists_take_the_readers_comma(language: str, separator: str) -> None:
    from comfyveil.telegram import parse

    with i18n.using(language), pytest.raises(parse.ParseError) as caught:
        parse.parse("/f a fox --bogus 1", {"seed": "", "steps": ""})
    allowed = str(caught.value).rsplit(":", 1)[1]
    assert allowed.count(separator) == 4, allowed  # --ar, --file, --no, --seed, --steps
