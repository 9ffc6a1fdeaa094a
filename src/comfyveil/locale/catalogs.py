"""Keeping the catalogs in step with the code (Babel), for maintainers.

    python -m comfyveil.locale.catalogs extract   # the code's texts -> messages.pot
    python -m comfyveil.locale.catalogs update    # messages.pot -> every LANG .po (new: empty)
    python -m comfyveil.locale.catalogs check     # what is untranslated, per language

Texts are found by their calls: ``_("...")``, ``n_("one", "many", n)`` and the marker
``N_("...")`` for module constants, in the Python code and (Jinja2's extractor) in the
web templates. A comment starting ``TRANSLATORS:`` just above a call
goes to the translators.
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

from babel.messages.catalog import Catalog
from babel.messages.extract import extract_from_dir
from babel.messages.pofile import read_po, write_po

from comfyveil import i18n

PACKAGE = Path(__file__).resolve().parents[1]
LOCALE = Path(__file__).resolve().parent
TEMPLATE = LOCALE / f"{i18n.DOMAIN}.pot"
KEYWORDS = {"_": None, "n_": (1, 2), "N_": None, "gettext": None, "ngettext": (1, 2)}
COMMENT_TAGS = ("TRANSLATORS:",)


def extract() -> Catalog:
    """Every text of the package marked for translation, as a template catalog."""
    catalog = Catalog(project="comfyveil", charset="utf-8", fuzzy=False)
    found = extract_from_dir(
        str(PACKAGE),
        # The web pages' texts: ``{{ _("...") }}`` and ``{% trans %}`` in the templates.
        method_map=[("**.py", "python"), ("web/templates/**.html", "jinja2")],
        options_map={"web/templates/**.html": {"extensions": "jinja2.ext.i18n",
                                               "trim_blocks": "true",
                                               "lstrip_blocks": "true"}},
        keywords=KEYWORDS,
        comment_tags=COMMENT_TAGS,
        strip_comment_tags=True,
    )
    for filename, lineno, message, comments, context in found:
        catalog.add(
            message,
            None,
            [(f"comfyveil/{filename}", lineno)],
            auto_comments=comments,
            context=context,
        )
    for name, text in shipped_workflow_texts():
        catalog.add(
            text,
            None,
            [(f"comfyveil/workflows/{name}", 0)],
            auto_comments=["a shipped workflow's text, shown in /help and the menu"],
        )
    return catalog


def shipped_workflow_texts() -> list[tuple[str, str]]:
    """(file name, text) of the shipped workflows' titles and descriptions, their options'
    included: users read them in /help and the command menu."""
    found = []
    for path in sorted((PACKAGE / "workflows").glob("*.toml")):
        with path.open("rb") as handle:
            table = tomllib.load(handle)
        texts = [table.get("title"), table.get("description")]
        texts += [p.get("description") for p in table.get("params", {}).values()]
        found += [(path.name, t) for t in texts if isinstance(t, str) and t]
    return found


def po_path(language: str) -> Path:
    return LOCALE / language / "LC_MESSAGES" / f"{i18n.DOMAIN}.po"


def read(path: Path, language: str | None = None) -> Catalog:
    with path.open("rb") as handle:
        return read_po(handle, locale=i18n.LANGUAGES.get(language or "", None), domain=i18n.DOMAIN)


def write(path: Path, catalog: Catalog) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        # File names without line numbers: an edit elsewhere in a file leaves the
        # catalogs as they are.
        write_po(handle, catalog, width=96, sort_output=False, omit_header=False,
                 include_lineno=False)


def update(languages: Iterable[str] = i18n.LANGUAGES) -> None:
    """Merge the template into every language's catalog (new texts empty, gone ones dropped)."""
    template = extract()
    write(TEMPLATE, template)
    for language in languages:
        path = po_path(language)
        if path.exists():
            catalog = read(path, language)
        else:
            catalog = Catalog(
                locale=i18n.LANGUAGES[language],
                domain=i18n.DOMAIN,
                project="comfyveil",
                charset="utf-8",
                fuzzy=False,
            )
        catalog.update(template, no_fuzzy_matching=True)
        catalog.obsolete.clear()
        write(path, catalog)


def untranslated(language: str) -> list[str]:
    catalog = read(po_path(language), language)
    missing = []
    for message in catalog:
        if not message.id:
            continue
        strings = message.string if isinstance(message.string, tuple) else (message.string,)
        if message.fuzzy or not all(strings):
            missing.append(message.id if isinstance(message.id, str) else message.id[0])
    return missing


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "check"
    if command == "extract":
        write(TEMPLATE, extract())
    elif command == "update":
        update()
    elif command == "check":
        bad = 0
        for language in i18n.LANGUAGES:
            missing = untranslated(language)
            bad += len(missing)
            print(f"{language}: {len(missing)} untranslated")
        return 1 if bad else 0
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
