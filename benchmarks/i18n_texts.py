"""What speaking the user's language costs: the bot's texts built in each shipped
language against the same texts in English, in the same run.

    .venv/bin/python benchmarks/i18n_texts.py [--rounds 2000]

Per language and round, three texts a user meets most: the /help message for every
shipped command (titles, option help and bounds from the catalogs), a queued job's
status line, and a refused option value (`/f a fox --steps 99`, raised by the workflow's
own check). English goes through the same code with no catalog to look in, so the ratio
is what the catalog lookups, plural rules and right-to-left isolates add. Languages are
interleaved round by round so they share the machine's conditions; the first use of
each catalog (its compile, a few milliseconds, once per process) is timed apart.
Prints a table, then one JSON object as the very last line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from comfyveil import i18n
from comfyveil.comfy import workflow
from comfyveil.desk import registry
from comfyveil.telegram import render, replies


def _entries() -> list[registry.Entry]:
    entries = []
    for wf in workflow.shipped().values():
        row = SimpleNamespace(title=wf.title, description=wf.description)
        entries.append(registry.Entry(wf.command, row, wf))  # type: ignore[arg-type]
    return entries


def _texts(entries: list[registry.Entry], flux: workflow.Workflow) -> int:
    """Build the three texts once; their total length (so none is optimised away)."""
    help_text = render.help_text([e.help() for e in entries])
    status = render.status_text(
        render.JobView(id="0" * 32, command="f", status="queued", position=3, eta_s=42.0)
    )
    try:
        flux.validate({"prompt": "a fox", "steps": 99})
        refusal = ""
    except workflow.ParamError as exc:
        refusal = replies.user_message(exc)
    return len(help_text) + len(status) + len(refusal)


def main(rounds: int) -> dict[str, Any]:
    entries = _entries()
    flux = workflow.find("f")
    first_use: dict[str, float] = {}
    for language in i18n.LANGUAGES:
        started = time.perf_counter()
        i18n.translations(language)
        first_use[language] = (time.perf_counter() - started) * 1000
    samples: dict[str, list[float]] = {language: [] for language in i18n.LANGUAGES}
    for _round in range(rounds):
        for language in i18n.LANGUAGES:
            with i18n.using(language):
                started = time.perf_counter()
                _texts(entries, flux)
                samples[language].append((time.perf_counter() - started) * 1e6)
    english = statistics.median(samples[i18n.DEFAULT])
    return {
        "rounds": rounds,
        "median_us": {lang: round(statistics.median(s), 1) for lang, s in samples.items()},
        "ratio_to_english": {
            lang: round(statistics.median(s) / english, 3) for lang, s in samples.items()
        },
        "catalog_first_use_ms": {lang: round(ms, 2) for lang, ms in first_use.items()},
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"{'language':<10} {'median (3 texts)':>17} {'vs English':>11} {'first use':>10}")
    print("-" * 51)
    for language, median in result["median_us"].items():
        ratio = result["ratio_to_english"][language]
        first = result["catalog_first_use_ms"][language]
        print(f"{language:<10} {median:>14.1f} us {ratio:>10.2f}x {first:>7.1f} ms")
    print(f"{result['rounds']} rounds, languages interleaved")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000, help="timed rounds per language")
    args = parser.parse_args()
    outcome = main(args.rounds)
    print_table(outcome)
    print(json.dumps(outcome))
