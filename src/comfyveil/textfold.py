"""Folding text for matching: one spelling for the many ways to write the same word (pure).

``fold("Ｇ\u200bоRÉ")`` is ``"gore"``: full-width letters, a zero-width space, a Cyrillic
``о`` and an accent all fold away. The content policy (:mod:`comfyveil.policy`) folds both
its terms and the prompts it checks, so a term matches however the prompt spells it.

Steps, in order:

1. Unicode NFKC: full-width and mathematical letters, ligatures, circled letters and odd
   spaces become their plain forms.
2. Invisible characters are removed: format characters (zero-width space, joiner and
   non-joiner, soft hyphen, bidi controls, word joiner, tags), variation selectors, the
   combining grapheme joiner, Hangul fillers and the Arabic tatweel.
3. Accents and other combining marks are removed (NFD, then marks dropped).
4. Look-alike letters become Latin: small capitals and other Latin variants always;
   Cyrillic, Greek and Armenian letters inside a word that mixes them with Latin, or in a
   word made only of letters that look Latin (a "whole-script confusable" such as
   Cyrillic ``ѕех``). A word in real Cyrillic or Greek keeps its letters, so Russian terms
   match Russian prompts. The table is a compact hand-kept subset of Unicode's
   confusables (TR39) for letters that really pass for Latin ones; the full table also maps
   sequences such as ``rn`` to ``m``, which would refuse innocent prompts.
5. Case folding, a few Arabic-script variants (Arabic and Persian yeh and kaf, teh marbuta)
   to one letter, and NFC.

A second view, :func:`joined`, also glues runs of single letters separated by spaces or
punctuation (``g o r e``, ``g.o.r.e``) into one word.
"""

from __future__ import annotations

import functools
import re
import unicodedata

# Not format characters (Cf), yet invisible or used as such.
_INVISIBLE_EXTRA = frozenset("\u034f\u115f\u1160\u3164\uffa0\u0640\u17b4\u17b5\u2800")

# Latin-script letters that stand in for plain ones: always folded.
_LATIN_VARIANTS = str.maketrans({
    "ᴀ": "a", "ʙ": "b", "ᴄ": "c", "ᴅ": "d", "ᴇ": "e", "ꜰ": "f", "ɢ": "g", "ʜ": "h",
    "ɪ": "i", "ᴊ": "j", "ᴋ": "k", "ʟ": "l", "ᴍ": "m", "ɴ": "n", "ᴏ": "o", "ᴘ": "p",
    "ʀ": "r", "ꜱ": "s", "ᴛ": "t", "ᴜ": "u", "ᴠ": "v", "ᴡ": "w", "ʏ": "y", "ᴢ": "z",
    "ɑ": "a", "ɡ": "g", "ı": "i", "ȷ": "j", "ɩ": "i", "ʋ": "u", "ꞵ": "b", "ɒ": "a",
})  # fmt: skip

# Cyrillic, Greek and Armenian letters that pass for Latin ones, upper and lower case
# apart (Greek capital eta looks like H, its small letter like n).
_CONFUSABLES: dict[str, str] = {
    # Cyrillic capitals and small letters
    "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P",
    "С": "C", "Т": "T", "У": "Y", "Х": "X", "Ѕ": "S", "І": "I", "Ј": "J", "Ԁ": "D",
    "Ү": "Y", "Һ": "H", "Ԛ": "Q", "Ԝ": "W", "Ӏ": "I",
    "а": "a", "в": "b", "е": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p",
    "с": "c", "т": "t", "у": "y", "х": "x", "ѕ": "s", "і": "i", "ј": "j", "ԁ": "d",
    "ү": "y", "һ": "h", "ԛ": "q", "ԝ": "w", "ӏ": "l", "ь": "b", "ɡ": "g",
    # Greek
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M",
    "Ν": "N", "Ο": "O", "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X",
    "α": "a", "β": "b", "γ": "y", "ε": "e", "η": "n", "ι": "i", "κ": "k", "ν": "v",
    "ο": "o", "ρ": "p", "τ": "t", "υ": "u", "χ": "x", "ω": "w", "ϲ": "c", "ϳ": "j",
    # Armenian
    "օ": "o", "ս": "u", "հ": "h", "ո": "n", "ց": "g", "զ": "q", "Տ": "S", "Օ": "O",
}  # fmt: skip
_CONFUSABLE_TABLE = str.maketrans(_CONFUSABLES)
_FOREIGN_SCRIPTS = ("CYRILLIC", "GREEK", "ARMENIAN")

_ARABIC_VARIANTS = str.maketrans({"ي": "ی", "ى": "ی", "ك": "ک", "ة": "ه"})

_WORD = re.compile(r"\w+")
# A run of three or more single letters or digits with separators between them.
_SPACED = re.compile(r"(?<!\w)\w(?:[\s.\-_*·•,+/|\\~'’`^]{1,3}\w(?!\w)){2,}")
_SEPARATORS = re.compile(r"[\s.\-_*·•,+/|\\~'’`^]+")


@functools.lru_cache(maxsize=4096)
def _script(char: str) -> str:
    """LATIN, CYRILLIC, GREEK, ARMENIAN or OTHER, from the character's Unicode name."""
    name = unicodedata.name(char, "")
    for script in ("LATIN", *_FOREIGN_SCRIPTS):
        if name.startswith(script):
            return script
    return "OTHER"


def _invisible(char: str) -> bool:
    return unicodedata.category(char) == "Cf" or char in _INVISIBLE_EXTRA


def _fold_word(match: re.Match[str]) -> str:
    word = match.group(0)
    scripts = {_script(c) for c in word if c.isalpha()}
    foreign = scripts & set(_FOREIGN_SCRIPTS)
    if not foreign:
        return word
    mixed = "LATIN" in scripts
    lookalike = all(c in _CONFUSABLES for c in word if c.isalpha() and _script(c) != "LATIN")
    if mixed or lookalike:
        return word.translate(_CONFUSABLE_TABLE)
    return word


def fold(text: str) -> str:
    """The folded form of `text` (see the module docstring); whitespace runs become one
    space."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(c for c in text if not _invisible(c))
    text = unicodedata.normalize("NFD", text)
    text = "".join(c for c in text if not unicodedata.category(c).startswith("M"))
    text = text.translate(_LATIN_VARIANTS)
    text = _WORD.sub(_fold_word, text)
    text = text.casefold().translate(_LATIN_VARIANTS).translate(_ARABIC_VARIANTS)
    return " ".join(unicodedata.normalize("NFC", text).split())


def joined(folded: str) -> str:
    """`folded` with runs of single letters glued into words: ``g o r e`` -> ``gore``."""
    return _SPACED.sub(lambda m: _SEPARATORS.sub("", m.group(0)), folded)
