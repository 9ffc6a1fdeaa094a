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
4. Look-alike letters become Latin, from Unicode's own confusables data (UTS #39, as the
   `confusable_homoglyphs` package ships it), each letter whose look-alike is one Latin
   letter once accents, strokes and overlays are dropped (``ø``, ``ł``, ``đ`` too); small
   capitals and other Latin variants (which UTS #39 keeps apart from lower case) by a
   short table. Latin-script letters always fold; Cyrillic, Greek, Armenian, Lisu,
   Cherokee and Coptic letters inside a word that mixes them with Latin, or in a word made
   only of letters that look Latin (a "whole-script confusable" such as Cyrillic ``ѕех``
   or Lisu ``ꓖꓳꓣꓰ``). A word in real Cyrillic or Greek keeps its letters, so Russian terms
   match Russian prompts. Sequences UTS #39 also maps (``rn`` to ``m``) are left alone:
   they would refuse innocent prompts.
5. Case folding, a few Arabic-script variants (Arabic and Persian yeh and kaf, teh marbuta)
   to one letter, and NFC.

More views, for the policy to search as well: :func:`joined` glues runs of single letters
separated by spaces or punctuation (``g o r e``, ``g.o.r.e``, ``(g)(o)(r)(e)``) into one
word; :func:`squeezed` drops punctuation between letters (``go:re``); :func:`unleet` reads
digits as letters where a word has letters on both sides (``g0re``, ``bl00d``, but not
``2000s`` or a model's ``g0``).
"""

from __future__ import annotations

import contextvars
import functools
import re
import unicodedata

# Not format characters (Cf), yet invisible or used as such.
_INVISIBLE_EXTRA = frozenset("\u034f\u115f\u1160\u3164\uffa0\u0640\u17b4\u17b5\u2800")

# Latin-script letters that stand in for plain ones: always folded.
_LATIN_VARIANT_MAP = {
    "ᴀ": "a", "ʙ": "b", "ᴄ": "c", "ᴅ": "d", "ᴇ": "e", "ꜰ": "f", "ɢ": "g", "ʜ": "h",
    "ɪ": "i", "ᴊ": "j", "ᴋ": "k", "ʟ": "l", "ᴍ": "m", "ɴ": "n", "ᴏ": "o", "ᴘ": "p",
    "ʀ": "r", "ꜱ": "s", "ᴛ": "t", "ᴜ": "u", "ᴠ": "v", "ᴡ": "w", "ʏ": "y", "ᴢ": "z",
    "ɑ": "a", "ɡ": "g", "ı": "i", "ȷ": "j", "ɩ": "i", "ʋ": "u", "ꞵ": "b", "ɒ": "a",
    "ĸ": "k",
}  # fmt: skip
_LATIN_VARIANTS = str.maketrans(_LATIN_VARIANT_MAP)

_EVERY_LOOKALIKE = contextvars.ContextVar("every_lookalike", default=False)
# Scripts whose words may be made wholly of look-alikes of Latin letters.
_FOREIGN_SCRIPTS = frozenset({"CYRILLIC", "GREEK", "ARMENIAN", "LISU", "CHEROKEE", "COPTIC"})


def _plain(text: str) -> str:
    text = unicodedata.normalize("NFD", text)
    return "".join(c for c in text if not unicodedata.category(c).startswith("M"))


@functools.cache
def _lookalikes() -> dict[str, str]:
    """Letter -> the Latin letter it passes for (lower case), from UTS #39's data."""
    from confusable_homoglyphs.confusables import confusables_data  # 0.1 s: on first use

    def latin(text: str) -> str | None:
        plain = _plain(text).translate(_LATIN_VARIANTS)
        if len(plain) == 1 and plain.isascii() and plain.isalpha():
            return plain
        return None

    table: dict[str, str] = {}
    for _ in range(3):  # look-alikes of look-alikes (Cyrillic в, small capital ʙ, b)
        for char, glyphs in confusables_data.items():
            if len(char) != 1 or char.isascii() or char in table:
                continue
            if not unicodedata.category(char).startswith("L"):
                continue
            found = {latin(g["c"]) or table.get(g["c"]) for g in glyphs} - {None}
            if len(found) == 1:
                letter = str(found.pop())
                # UTS #39 gives capital I the prototype l; a capital reads as I
                if char.isupper() and letter in "lI":
                    letter = "i"
                table[char] = letter.lower()
    for variant, letter in _LATIN_VARIANT_MAP.items():
        table.setdefault(variant, letter)
    return table


_ARABIC_VARIANTS = str.maketrans({"ي": "ی", "ى": "ی", "ك": "ک", "ة": "ه"})

_WORD = re.compile(r"\w+")
# A run of three or more single letters or digits with separators between them.
_SEPARATOR = r"[\s.\-_*·•,+/|\\~'’`^:;()\[\]{}<>=\"]"
_SPACED = re.compile(rf"(?<!\w)\w(?:{_SEPARATOR}{{1,3}}\w(?!\w)){{2,}}")
_SEPARATORS = re.compile(rf"{_SEPARATOR}+")
# Punctuation (no space) between two letters: go:re, g(o)re.
_INSIDE = re.compile(r"(?<=[^\W\d_])[.\-_*·•+/|\\~'’`^:;()\[\]{}<>=\"]+(?=[^\W\d_])")
# Digits with letters on both sides: g0re, bl00d; not 2000s, not a model's g0.
_LEET = re.compile(r"(?<=[^\W\d_])[0-9]+(?=[^\W\d_])")
_LEET_DIGITS = (str.maketrans("0134578", "oieastb"), str.maketrans("0134578", "oleastb"))


@functools.lru_cache(maxsize=4096)
def _script(char: str) -> str:
    """LATIN, CYRILLIC, GREEK, LISU ... from the character's Unicode name."""
    name = unicodedata.name(char, "")
    return name.split(" ", 1)[0] if name else "OTHER"


def _invisible(char: str) -> bool:
    return unicodedata.category(char) == "Cf" or char in _INVISIBLE_EXTRA


def _fold_word(match: re.Match[str]) -> str:
    word = match.group(0)
    table = _lookalikes()
    if _EVERY_LOOKALIKE.get():
        return "".join(table.get(c, c) for c in word)
    letters = [c for c in word if c.isalpha()]
    scripts = {_script(c) for c in letters}
    if scripts <= {"LATIN"}:
        return "".join(table.get(c, c) for c in word)
    mixed = "LATIN" in scripts
    lookalike = scripts - {"LATIN"} <= _FOREIGN_SCRIPTS and all(
        c in table for c in letters if _script(c) != "LATIN"
    )
    if mixed or lookalike:
        return "".join(table.get(c, c) for c in word)
    return "".join(table.get(c, c) if _script(c) == "LATIN" else c for c in word)


def fold(text: str, *, every_lookalike: bool = False) -> str:
    """The folded form of `text` (see the module docstring); whitespace runs become one
    space.

    `every_lookalike` folds every look-alike letter, even in a word of real Cyrillic or
    Greek: the form of a term that a prompt mixing in Latin letters (``кpовь``, Latin p)
    takes.
    """
    token = _EVERY_LOOKALIKE.set(every_lookalike)
    try:
        return _fold(text)
    finally:
        _EVERY_LOOKALIKE.reset(token)


def _fold(text: str) -> str:
    text = unicodedata.normalize("NFKC", text)
    text = "".join(c for c in text if not _invisible(c))
    text = unicodedata.normalize("NFD", text)
    text = "".join(c for c in text if not unicodedata.category(c).startswith("M"))
    text = _WORD.sub(_fold_word, text)
    text = text.casefold()
    text = _WORD.sub(_fold_word, text)  # a letter whose lower case is the look-alike
    text = text.translate(_ARABIC_VARIANTS)
    return " ".join(unicodedata.normalize("NFC", text).split())


def joined(folded: str) -> str:
    """`folded` with runs of single letters glued into words: ``g o r e`` -> ``gore``."""
    return _SPACED.sub(lambda m: _SEPARATORS.sub("", m.group(0)), folded)


def squeezed(folded: str) -> str:
    """`folded` without punctuation between letters: ``go:re`` -> ``gore``."""
    return _INSIDE.sub("", folded)


def unleet(folded: str) -> list[str]:
    """`folded` with digits read as letters where letters stand on both sides (``1`` once
    as ``i`` and once as ``l``); empty when there are none."""
    if not _LEET.search(folded):
        return []
    return list(
        dict.fromkeys(
            _LEET.sub(lambda m, table=table: m.group(0).translate(table), folded)
            for table in _LEET_DIGITS
        )
    )
