"""Turn a `BenchResult` into the seed's table and the four result files.

Everything here is pure (records in, text out) except the writers at the bottom.
The headline table is the seed's: one row per workflow, the mean seconds on each
backend, then for every backend after the first the seed's speedup
(t_base - t_other) / t_base and the ratio t_base / t_other.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from comfyveil.bench import records, stats

MISSING = "n/a"
CSV_FIELDS = (
    "workflow", "backend", "run", "seed", "ok", "error", "wall_s", "execution_s", "upload_s",
    "download_s", "sampler_its", "outputs", "output_bytes", "cached_nodes", "prompt_id",
)


@dataclass(frozen=True)
class Column:
    """One column of the headline table: a backend (of one results file) and its summaries."""

    label: str
    summaries: Mapping[str, stats.Summary]  # workflow name -> summary


def summarize_runs(runs: Sequence[records.RunRecord], metric: records.Metric) -> stats.Summary:
    values = [s for r in runs if r.ok and (s := r.seconds(metric)) is not None]
    return stats.summarize(values, failed=sum(1 for r in runs if not r.ok))


def columns(result: records.BenchResult, prefix: str = "") -> list[Column]:
    """The headline columns of one result, one per backend, in the order given."""
    return [
        Column(
            label=f"{prefix}{backend.name}",
            summaries={
                wf.name: summarize_runs(result.records_for(wf.name, backend.name), result.metric)
                for wf in result.workflows
            },
        )
        for backend in result.backends
    ]


def _seconds(value: float | None) -> str:
    return MISSING if value is None else f"{value:.2f}"


def _percent(value: float | None) -> str:
    return MISSING if value is None else f"{value * 100:.1f}%"


def _times(value: float | None) -> str:
    return MISSING if value is None else f"{value:.2f}x"


def _mean_cell(summary: stats.Summary | None) -> str:
    if summary is None:
        return "not run"
    cell = _seconds(summary.mean)
    if summary.failed:
        cell += f" ({summary.failed} failed)"
    return cell


def headline(workflows: Sequence[str], cols: Sequence[Column]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the seed's table; the first column is the base."""
    base = cols[0]
    header = ["template", *(f"{c.label} mean s" for c in cols)]
    for other in cols[1:]:
        header += [f"speedup {other.label} vs {base.label}", f"ratio {base.label}/{other.label}"]
    rows = []
    for name in workflows:
        base_mean = base.summaries[name].mean if name in base.summaries else None
        row = [name, *(_mean_cell(c.summaries.get(name)) for c in cols)]
        for other in cols[1:]:
            other_mean = other.summaries[name].mean if name in other.summaries else None
            row += [
                _percent(stats.speedup(base_mean, other_mean)),
                _times(stats.ratio(base_mean, other_mean)),
            ]
        rows.append(row)
    return header, rows


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], *, text_columns: int = 1
) -> str:
    """A Markdown table; the first `text_columns` columns align left, numbers right."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    aligns = ["---" if i < text_columns else "---:" for i in range(len(header))]
    return "\n".join([line(header), line(aligns), *(line(r) for r in rows)])


def _mean_of(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def detail(result: records.BenchResult) -> tuple[list[str], list[list[str]]]:
    """Spread and the other measurements, one row per workflow and backend."""
    metric_name = "server" if result.metric == "server" else "wall"
    header = [
        "template", "backend", "ok", "failed", f"mean s ({metric_name})", "median s", "p90 s",
        "stdev s", "min-max s", "wall mean s", "server mean s", "sampler it/s", "upload s",
        "download s", "outputs",
    ]
    rows = []
    for wf in result.workflows:
        for backend in result.backends:
            runs = result.records_for(wf.name, backend.name)
            if not runs:
                continue
            s = summarize_runs(runs, result.metric)
            ok = [r for r in runs if r.ok]
            spread = MISSING if s.min is None else f"{s.min:.2f}-{s.max:.2f}"
            its = _mean_of([r.sampler_its for r in ok])
            rows.append([
                wf.name, backend.name, str(s.n), str(s.failed), _seconds(s.mean),
                _seconds(s.median), _seconds(s.p90), _seconds(s.stdev), spread,
                _seconds(_mean_of([r.wall_s for r in ok])),
                _seconds(_mean_of([r.execution_s for r in ok])),
                MISSING if its is None else f"{its:.2f}",
                _seconds(_mean_of([r.upload_s for r in ok])) if wf.input_image else "-",
                _seconds(_mean_of([r.download_s for r in ok])),
                str(sum(r.outputs for r in ok)),
            ])
    return header, rows


def node_table(result: records.BenchResult, workflow: str) -> tuple[list[str], list[list[str]]]:
    """Mean seconds per node of one workflow, one column per backend."""
    per_backend: dict[str, dict[str, list[float]]] = {}
    labels: dict[str, str] = {}
    order: list[str] = []
    for backend in result.backends:
        times: dict[str, list[float]] = {}
        for run in result.records_for(workflow, backend.name):
            if not run.ok:
                continue
            for node in run.nodes:
                times.setdefault(node.node, []).append(node.seconds)
                if node.node not in labels:
                    labels[node.node] = f"{node.node} {node.class_type or ''}".strip()
                    order.append(node.node)
        per_backend[backend.name] = times
    header = ["node", *(f"{b.name} mean s" for b in result.backends)]
    rows = [
        [labels[node], *(
            _seconds(statistics.fmean(per_backend[b.name][node]))
            if per_backend[b.name].get(node) else MISSING
            for b in result.backends
        )]
        for node in order
    ]
    return header, rows


def environment(result: records.BenchResult) -> tuple[list[str], list[list[str]]]:
    header = ["backend", "url", "GPU", "VRAM GiB", "ComfyUI", "PyTorch", "Python"]
    rows = []
    for b in result.backends:
        if b.error:
            rows.append([b.name, b.url, f"unknown: {b.error}", "", "", "", ""])
            continue
        vram = MISSING if b.vram_bytes is None else f"{b.vram_bytes / 2**30:.1f}"
        python = (b.python_version or MISSING).split(" ")[0]
        rows.append([
            b.name, b.url, b.gpu or MISSING, vram, b.comfyui_version or MISSING,
            b.pytorch_version or MISSING, python,
        ])
    return header, rows


def render_markdown(result: records.BenchResult) -> str:
    names = [wf.name for wf in result.workflows]
    what = (
        "server execution time (execution_start to execution_success)"
        if result.metric == "server" else "wall time from submit to done"
    )
    parts = [
        "# comfyveil benchmark",
        "",
        f"{result.started_at} to {result.finished_at}; {result.runs} measured run(s) per "
        f"template and backend after {result.warmup} warm-up run(s); mode: {result.mode}. "
        f"Seconds are the mean {what}. Speedup is the seed's (t_base - t_other) / t_base, "
        f"base = {result.backends[0].name}; ratio is t_base / t_other.",
        "",
        markdown_table(*headline(names, columns(result))),
        "",
        "## Spread and other measurements",
        "",
        markdown_table(*detail(result), text_columns=2),
    ]
    if result.parallel is not None:
        p = result.parallel
        per = ", ".join(
            f"{name}: {p.runs_per_backend[name]} runs, {p.outputs_per_backend.get(name, 0)} outputs"
            for name in p.runs_per_backend
        )
        parts += [
            "",
            "## All backends at once",
            "",
            f"{p.outputs} outputs in {p.wall_s:.2f} s: **{p.outputs_per_minute:.2f} outputs per "
            f"minute** in total ({per}).",
        ]
    parts += ["", "## Environment", "", markdown_table(*environment(result), text_columns=7)]
    parts += ["", "## Workflows", ""]
    for wf in result.workflows:
        seed = f"seed input `{wf.seed_param}`" if wf.seed_param else "no seed input"
        parts.append(f"- {wf.name} ({wf.kind}): hash `{wf.hash}`, {seed}")
    for wf in result.workflows:
        header, rows = node_table(result, wf.name)
        if rows:
            parts += ["", f"### Per-node time: {wf.name}", "", markdown_table(header, rows)]
    if result.failed:
        parts += ["", "## Failed runs", ""]
        parts += [
            f"- {r.workflow} on {r.backend}, run {r.run + 1}: {r.error}" for r in result.failed
        ]
    cached = [r for r in result.records if r.ok and r.cached_nodes]
    if any(not wf.seed_param for wf in result.workflows) and cached:
        parts += [
            "",
            "Note: a workflow without a seed input was partly served from ComfyUI's cache "
            "(see cached_nodes in results.csv); its times understate a fresh run.",
        ]
    return "\n".join(parts) + "\n"


def _csv_value(value: object) -> object:
    if isinstance(value, float):
        return f"{value:.6f}"
    return "" if value is None else value


def render_csv(result: records.BenchResult) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for r in result.records:
        writer.writerow([_csv_value(getattr(r, name)) for name in CSV_FIELDS])
    return buffer.getvalue()


def render_png(result: records.BenchResult) -> bytes:
    """A grouped bar chart: mean seconds per workflow and backend, error bars one stdev."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    names = [wf.name for wf in result.workflows]
    cols = columns(result)
    figure = Figure(figsize=(max(6.0, 1.6 * len(names) + 2), 4.5), dpi=100)
    axes = figure.subplots()
    width = 0.8 / max(1, len(cols))
    for index, col in enumerate(cols):
        means = [col.summaries[n].mean or 0.0 for n in names]
        errors = [col.summaries[n].stdev or 0.0 for n in names]
        xs = [i + (index - (len(cols) - 1) / 2) * width for i in range(len(names))]
        axes.bar(xs, means, width, yerr=errors, capsize=4, label=col.label)
    axes.set_xticks(range(len(names)), names, rotation=15)
    axes.set_ylabel("seconds (mean, error bar = 1 stdev)")
    axes.set_title("comfyveil benchmark")
    axes.legend()
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _write_all(result: records.BenchResult, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / "results.json",
        "csv": out_dir / "results.csv",
        "md": out_dir / "results.md",
        "png": out_dir / "results.png",
    }
    paths["json"].write_text(json.dumps(result.to_json(), indent=2) + "\n", "utf-8")
    paths["csv"].write_text(render_csv(result), "utf-8")
    paths["md"].write_text(render_markdown(result), "utf-8")
    paths["png"].write_bytes(render_png(result))
    return paths


async def write_all(result: records.BenchResult, out_dir: Path) -> dict[str, Path]:
    """Write results.json, .csv, .md and .png into `out_dir` (created if needed)."""
    return await asyncio.to_thread(_write_all, result, out_dir)


def load(path: Path) -> records.BenchResult:
    """Read a results.json written by `comfyveil bench`.

    Raises:
        records.ResultsFileError: the file is missing, not JSON or not a results file.
    """
    try:
        doc = json.loads(path.read_text("utf-8"))
    except OSError as exc:
        raise records.ResultsFileError(f"cannot read {path}: {exc.strerror}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise records.ResultsFileError(f"{path} is not a JSON file") from exc
    return records.BenchResult.from_json(doc)
