"""User-facing words that depend on a number, in gettext's shape.

A later change translates every user-facing text with gettext; until then `ngettext`
here has the standard library's signature and English's rule (one / other), so wrapping
it is a change of import: ``ngettext("{n} job", "{n} jobs", n).format(n=n)``.
"""

from __future__ import annotations


def ngettext(singular: str, plural: str, n: int) -> str:
    """`singular` for one, else `plural` (as ``gettext.ngettext`` without a catalogue)."""
    return singular if n == 1 else plural
