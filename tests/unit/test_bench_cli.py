from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from comfyveil.bench import records, report
from comfyveil.cli import _run_args, bench
from comfyveil.errors import UsageError


def test_backends_are_name_equals_url() -> None:
    backends = bench.parse_backends(["4090=http://127.0.0.1:8188/", "http://127.0.0.1:8189"])
    assert [(b.name, b.url) for b in backends] == [
        ("4090", "http://127.0.0.1:8188"), ("gpu1", "http://127.0.0.1:8189")]


@pytest.mark.parametrize("bad", ["gpu=127.0.0.1:8188", "=http://127.0.0.1:1", "ftp://x"])
def test_bad_backends_are_refused_in_plain_words(bad: str) -> None:
    with pytest.raises(UsageError, match="NAME=URL"):
        bench.parse_backends([bad])


def test_duplicate_backend_names_are_refused() -> None:
    with pytest.raises(UsageError, match="same name"):
        bench.parse_backends(["a=http://127.0.0.1:1", "a=http://127.0.0.1:2"])


def test_set_values() -> None:
    parse = _run_args.parse_assignments
    assert parse(["steps=4", "prompt=a=b"]) == {"steps": "4", "prompt": "a=b"}
    with pytest.raises(UsageError):
        parse(["steps"])


def test_bench_and_compare_parse() -> None:
    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers())
    args = parser.parse_args(["bench", "--backend", "a=http://127.0.0.1:1", "--runs", "2",
                              "--parallel", "--set", "steps=2"])
    assert args.handler is bench.run_bench and args.runs == 2 and args.parallel
    args = parser.parse_args(["bench", "compare", "a.json", "b.json"])
    assert args.handler is bench.run_compare and args.a == Path("a.json")


def test_image_that_is_not_an_image_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "x.png"
    fake.write_text("hello")
    with pytest.raises(UsageError, match="not an image"):
        bench._read_image(fake)


def _result(name: str, seconds: float) -> records.BenchResult:
    return records.BenchResult(
        started_at="2026-01-01T00:00:00+00:00", finished_at="2026-01-01T00:01:00+00:00",
        mode="sequential", metric="server", runs=1, warmup=0, seed_base=42,
        backends=(records.BackendEnv(name, "http://127.0.0.1:8188"),),
        workflows=(records.WorkflowInfo("sd35", "ff" * 32, "image", "seed"),),
        records=(records.RunRecord("sd35", name, 0, 42, True, wall_s=seconds,
                                   execution_s=seconds),),
    )


async def test_compare_command_prints_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await report.write_all(_result("4090", 8.96), tmp_path / "a")
    await report.write_all(_result("5090", 5.96), tmp_path / "b")
    args = argparse.Namespace(a=tmp_path / "a" / "results.json", b=tmp_path / "b" / "results.json")
    assert await bench.run_compare(args) == 0
    out = capsys.readouterr().out
    assert "| sd35 | 8.96 | 5.96 | 33.5% | 1.50x |" in out
