"""Compare two earlier benchmark results, for example two machines measured weeks apart.

Workflows are matched by name; every backend of both files becomes a column, labelled
`A:name` and `B:name`. The base of speedup and ratio is the first backend of A.
"""

from __future__ import annotations

from dataclasses import dataclass

from comfyveil.bench import records, report


@dataclass(frozen=True)
class Comparison:
    header: list[str]
    rows: list[list[str]]
    only_in_a: list[str]
    only_in_b: list[str]
    notes: list[str]


def compare(a: records.BenchResult, b: records.BenchResult) -> Comparison:
    names_a = [wf.name for wf in a.workflows]
    names_b = [wf.name for wf in b.workflows]
    common = [n for n in names_a if n in names_b]
    cols = report.columns(a, prefix="A:") + report.columns(b, prefix="B:")
    header, rows = report.headline(common, cols)
    notes = []
    if a.metric != b.metric:
        notes.append(
            f"A measured {a.metric} time and B measured {b.metric} time; the figures are not "
            "strictly comparable."
        )
    hashes_a = {wf.name: wf.hash for wf in a.workflows}
    for wf in b.workflows:
        if wf.name in hashes_a and hashes_a[wf.name] != wf.hash:
            notes.append(f"{wf.name}: the workflow differs between A and B (hash changed).")
    return Comparison(
        header=header,
        rows=rows,
        only_in_a=[n for n in names_a if n not in names_b],
        only_in_b=[n for n in names_b if n not in names_a],
        notes=notes,
    )


def render(comparison: Comparison) -> str:
    lines = [report.markdown_table(comparison.header, comparison.rows)]
    if comparison.only_in_a:
        lines.append("only in A: " + ", ".join(comparison.only_in_a))
    if comparison.only_in_b:
        lines.append("only in B: " + ", ".join(comparison.only_in_b))
    lines += comparison.notes
    return "\n".join(lines) + "\n"
