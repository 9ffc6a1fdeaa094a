from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from comfyveil.bench import compare, records, report
from tests.lazy import lazy_import

jsonschema = lazy_import("jsonschema")  # loaded by the first test that uses it


def _run(
    workflow: str, backend: str, run: int, seconds: float | None, **kw: object
) -> records.RunRecord:
    ok = seconds is not None
    return records.RunRecord(
        workflow=workflow, backend=backend, run=run, seed=42 + run, ok=ok,
        error=None if ok else "the backend stopped answering",
        wall_s=None if seconds is None else seconds + 0.05,
        execution_s=seconds,
        nodes=(records.NodeTime("3", "KSampler", seconds * 0.8),) if seconds else (),
        sampler_its=10.0 if ok else None,
        outputs=1 if ok else 0,
        output_bytes=1000 if ok else 0,
        prompt_id=f"p{run}",
        started_at=1000.0 + run,
        **kw,  # type: ignore[arg-type]
    )


def _result(times: dict[str, dict[str, list[float | None]]], **kw: object) -> records.BenchResult:
    backends = sorted({b for per in times.values() for b in per}, key=lambda b: b != "gpu0")
    runs = [
        _run(wf, backend, i, t)
        for wf, per in times.items() for backend, values in per.items()
        for i, t in enumerate(values)
    ]
    return records.BenchResult(
        started_at="2026-01-01T00:00:00+00:00",
        finished_at="2026-01-01T00:05:00+00:00",
        mode="sequential", metric="server", runs=3, warmup=1, seed_base=42,
        backends=tuple(
            records.BackendEnv(name=b, url=f"http://127.0.0.1:{8188 + i}", gpu="NVIDIA RTX 4090",
                               vram_bytes=24 * 2**30, comfyui_version="0.3.64",
                               pytorch_version="2.8.0", python_version="3.11.7 (main)", os="posix")
            for i, b in enumerate(backends)
        ),
        workflows=tuple(
            records.WorkflowInfo(name=wf, hash="ab" * 32, kind="image", seed_param="seed",
                                 params={"steps": 4})
            for wf in times
        ),
        records=tuple(runs),
        tool_version="0.1.0",
        **kw,  # type: ignore[arg-type]
    )


SEED_LIKE = {
    "sd35": {"gpu0": [8.9, 9.0, 8.98], "gpu1": [5.9, 6.0, 5.98]},
    "flux_schnell": {"gpu0": [4.9, 4.94, 4.92], "gpu1": [1.8, 1.79, 1.81]},
}


def test_headline_is_the_seed_table() -> None:
    result = _result(SEED_LIKE)
    header, rows = report.headline(["sd35", "flux_schnell"], report.columns(result))
    assert header == ["template", "gpu0 mean s", "gpu1 mean s", "speedup gpu1 vs gpu0",
                      "ratio gpu0/gpu1"]
    assert rows[0] == ["sd35", "8.96", "5.96", "33.5%", "1.50x"]
    assert rows[1] == ["flux_schnell", "4.92", "1.80", "63.4%", "2.73x"]


def test_failed_runs_show_in_the_table_and_markdown() -> None:
    result = _result({"sd35": {"gpu0": [2.0, 2.0, 2.0], "gpu1": [1.0, None, None]}})
    _, rows = report.headline(["sd35"], report.columns(result))
    assert rows[0][2] == "1.00 (2 failed)"
    text = report.render_markdown(result)
    assert "## Failed runs" in text
    assert "sd35 on gpu1, run 2: the backend stopped answering" in text


def test_a_backend_with_no_successful_run_has_no_speedup() -> None:
    result = _result({"sd35": {"gpu0": [2.0], "gpu1": [None]}})
    _, rows = report.headline(["sd35"], report.columns(result))
    assert rows[0] == ["sd35", "2.00", "n/a (1 failed)", "n/a", "n/a"]


def test_wall_metric_uses_wall_time() -> None:
    result = _result({"sd35": {"gpu0": [2.0], "gpu1": [1.0]}})
    wall = records.BenchResult(**{**result.__dict__, "metric": "wall"})
    _, rows = report.headline(["sd35"], report.columns(wall))
    assert rows[0][1:3] == ["2.05", "1.05"]


def test_markdown_has_spread_environment_and_nodes() -> None:
    text = report.render_markdown(_result(SEED_LIKE))
    assert "| sd35 | gpu0 | 3 | 0 | 8.96 |" in text
    assert "8.90-9.00" in text
    assert "NVIDIA RTX 4090" in text and "24.0" in text
    assert "### Per-node time: sd35" in text and "3 KSampler" in text


def test_csv_has_one_row_per_run() -> None:
    result = _result({"sd35": {"gpu0": [2.0, 3.0], "gpu1": [1.0, None]}})
    rows = list(csv.DictReader(io.StringIO(report.render_csv(result))))
    assert len(rows) == 4
    failed = [r for r in rows if r["ok"] == "False"]
    assert len(failed) == 1 and failed[0]["error"] == "the backend stopped answering"
    assert float(rows[1]["execution_s"]) == pytest.approx(3.0)


def test_json_round_trips_and_validates(tmp_path: Path) -> None:
    result = _result(SEED_LIKE, parallel=records.ParallelSummary(
        wall_s=30.0, outputs=12, outputs_per_minute=24.0,
        runs_per_backend={"gpu0": 5, "gpu1": 7}, outputs_per_backend={"gpu0": 5, "gpu1": 7},
    ))
    doc = json.loads(json.dumps(result.to_json()))
    jsonschema.validate(doc, records.schema())
    assert records.BenchResult.from_json(doc) == result


def test_schema_rejects_a_failed_run_without_its_error() -> None:
    doc = _result({"sd35": {"gpu0": [None]}}).to_json()
    doc["records"][0]["error"] = None
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, records.schema())


def test_newer_schema_is_refused_in_plain_words() -> None:
    doc = _result(SEED_LIKE).to_json()
    doc["schema_version"] = records.SCHEMA_VERSION + 1
    with pytest.raises(records.ResultsFileError, match="upgrade comfyveil"):
        records.BenchResult.from_json(doc)


def test_load_refuses_files_that_are_not_results(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("not json")
    with pytest.raises(records.ResultsFileError, match="not a JSON file"):
        report.load(bad)
    bad.write_text('{"hello": 1}')
    with pytest.raises(records.ResultsFileError):
        report.load(bad)
    with pytest.raises(records.ResultsFileError, match="cannot read"):
        report.load(tmp_path / "missing.json")


async def test_write_all_writes_four_files(tmp_path: Path) -> None:
    paths = await report.write_all(_result(SEED_LIKE), tmp_path / "out")
    assert {p.name for p in paths.values()} == {
        "results.json", "results.csv", "results.md", "results.png"}
    assert paths["png"].read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert report.load(paths["json"]) == _result(SEED_LIKE)


def test_compare_two_machines() -> None:
    a = _result({"sd35": {"gpu0": [9.0]}, "wan": {"gpu0": [60.0]}})
    b_raw = _result({"sd35": {"gpu0": [6.0]}, "qwen": {"gpu0": [4.0]}})
    comparison = compare.compare(a, b_raw)
    assert comparison.header[:3] == ["template", "A:gpu0 mean s", "B:gpu0 mean s"]
    assert comparison.rows == [["sd35", "9.00", "6.00", "33.3%", "1.50x"]]
    assert comparison.only_in_a == ["wan"] and comparison.only_in_b == ["qwen"]
    text = compare.render(comparison)
    assert "only in A: wan" in text and "only in B: qwen" in text
