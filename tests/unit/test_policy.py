"""The content policy: folding, terms and patterns, evasions refused, innocent prompts
passed, config errors, spoilers."""

from __future__ import annotations

import pytest

from comfyveil import config_load, policy, textfold
from comfyveil.comfy import workflow
from comfyveil.errors import ConfigError

RULES = {
    "terms": ["gore", "behead*", "кровь", "血腥", "blood"],
    "patterns": [r"\bkill(ed|ing)?\s+(him|her)\b"],
    "commands": {"wan": {"terms": ["blood"], "spoiler": True}},
    "spoiler_chats": [-100],
}

EVASIONS = [
    "a scene full of gore",
    "GORE",
    "ｇｏｒｅ everywhere",  # full-width letters
    "g\u200dore",  # zero-width joiner
    "g\u200bo\u200cr\u200de",  # zero-width space, non-joiner, joiner
    "go\u00adre",  # soft hyphen
    "g\u2066ore\u2069",  # bidi isolates
    "gore\ufe0f",  # variation selector
    "gоre",  # Cyrillic о
    "gοre",  # Greek ο
    "ɢᴏʀᴇ",  # small capitals
    "𝐠𝐨𝐫𝐞",  # mathematical bold
    "ⓖⓞⓡⓔ",  # circled letters
    "gòré",  # accents
    "g o r e",
    "g.o.r.e",
    "the beheading of a statue",
    "BeHeAdEd",
    "they killed him",
    "KÍLLING  HER slowly",
    "Кровь на снегу",  # a Russian term, any case
    "кр\u200dовь",
    "кpовь",  # Latin p inside the Russian word
    "满屏血腥画面",  # Chinese: no spaces between words
    # issue 22: what the hand table let through
    "gøre",  # letters with strokes
    "ǥøřɇ",
    "ꓖꓳꓣꓰ",  # Lisu
    "ᏀᎾᏒᎬ",  # Cherokee
    "ԍore",  # a Cyrillic letter the table lacked
    "g0re",  # digits for letters
    "bl00d moon on wan",
    "⒢⒪⒭⒠",  # parenthesised letters
    "g:o:r:e",
    "go:re",
    "(g)(o)(r)(e)",
    "k1lled him",
]

INNOCENT = [
    "a red fox in the snow",
    "a gorgeous sunset over the sea",
    "a gorilla eating an orange",
    "a kilt on him",
    "ahead of the storm",
    "красная лиса в снегу",
    "روباه قرمز در برف",
    "雪中的红狐狸",
    "İstanbul'da bir kedi",
    "un zorro rojo en la nieve",
    "the Øresund bridge at dawn",
    "fashion of the 2000s",
    "a portrait, model sdxl-g0 v2",
    "a g0 board, 9x9",
    "4k wallpaper of a mountain",
]


@pytest.fixture(scope="module")
def compiled() -> policy.Policy:
    return policy.Policy(policy.from_table(RULES))


@pytest.mark.parametrize("prompt", EVASIONS)
def test_evasions_are_still_refused(compiled: policy.Policy, prompt: str) -> None:
    assert compiled.refuses("f", [prompt])


@pytest.mark.parametrize("prompt", INNOCENT)
def test_innocent_prompts_pass(compiled: policy.Policy, prompt: str) -> None:
    assert not compiled.refuses("f", [prompt])


def test_a_command_adds_its_own_terms_to_the_common_ones() -> None:
    compiled = policy.Policy(policy.from_table({**RULES, "terms": ["gore"]}))
    assert compiled.refuses("wan", ["a blood moon"])
    assert compiled.refuses("wan", ["gore"])
    assert not compiled.refuses("f", ["a blood moon"])


def test_folding_keeps_real_words_of_other_scripts() -> None:
    assert textfold.fold("ЛЮБОВЬ") == "любовь"  # not every letter looks Latin: kept
    assert textfold.fold("ѕех") == "sex"  # every letter looks Latin: folded
    assert textfold.fold("می\u200cخواهم") == "میخواهم"
    assert textfold.fold("يك") == textfold.fold("یک")  # Arabic and Persian yeh, kaf


def test_spoilers_per_command_chat_workflow_and_all(compiled: policy.Policy) -> None:
    assert compiled.spoiler("wan", 5)
    assert compiled.spoiler("f", -100)
    assert not compiled.spoiler("f", 5)
    assert compiled.spoiler("f", 5, workflow_spoiler=True)
    everything = policy.Policy(policy.from_table({"spoiler": True}))
    assert everything.spoiler("f", 5)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"terms": "gore"}, "policy.terms must be a list of strings"),
        ({"patterns": ["(unclosed"]}, "not a valid regular expression"),
        ({"spoiler": "yes"}, "policy.spoiler must be true or false"),
        ({"colour": 1}, "unknown key(s) in [policy]: colour"),
        ({"commands": {"f": {"words": []}}}, "unknown key(s) in [policy.commands.f]: words"),
        ({"spoiler_chats": ["x"]}, "numeric chat ids"),
        ({"terms": ["\u200b"]}, "has no letters"),
    ],
)
def test_config_mistakes_are_refused_at_start(table: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_load.from_mapping({"policy": table}, environ={})
    assert message in str(caught.value)


def test_the_refusal_is_one_plain_sentence() -> None:
    assert str(policy.PromptRefused()) == (
        "This bot does not accept that prompt; nothing was queued."
    )


def test_workflow_spoiler_and_translated_titles_load_from_toml() -> None:
    shipped = workflow.shipped()["flux_schnell_full_text_to_image"]
    assert shipped.source is not None
    text = shipped.source.read_text()
    graph = shipped.source.with_suffix(".json").read_text()
    text = text.replace(
        'title = "Flux Schnell"\n',
        'spoiler = true\ntitle.default = "Flux"\ntitle.fa = "فلاکس"\ntitle.zh-Hans = "通量"\n',
    )
    wf = workflow.loads("mine", text, graph)
    assert wf.spoiler
    assert (wf.title, wf.title_in("fa"), wf.title_in("zh-hans"), wf.title_in("ru")) == (
        "Flux",
        "فلاکس",
        "通量",
        "Flux",
    )
    assert wf.hash != shipped.hash
    with pytest.raises(workflow.WorkflowError, match="needs a default text"):
        workflow.loads("bad", text.replace('title.default = "Flux"\n', ""), graph)
