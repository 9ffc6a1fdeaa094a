"""`comfyveil workflows` against a real PostgreSQL and a fake ComfyUI."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.test_generate import Run
from tests.e2e.test_generate import comfyveil as run_cli
from tests.fakes.comfyui import FakeComfyUI

DATA = Path(__file__).parents[1] / "data" / "workflows"


async def cli(tmp_path: Path, database_url: str, *args: str) -> Run:
    config = tmp_path / "comfyveil.toml"
    config.write_text(f'[database]\nurl = "{database_url}"\n')
    return await run_cli("workflows", *args, "--config", str(config), cwd=tmp_path)


def listing(run: Run) -> dict[str, str]:
    return {line.split()[0]: line for line in run.stdout.splitlines()}


async def test_shipped_commands_are_listed_and_an_operator_adds_one(
    tmp_path: Path, database_url: str
) -> None:
    shown = listing(await cli(tmp_path, database_url, "list"))
    assert {"/f", "/fd", "/sd3", "/wan", "/qwen"} <= set(shown)
    assert listing(await cli(tmp_path, database_url)) == shown  # `workflows` alone lists
    assert "enabled" in shown["/f"] and "[shipped]" in shown["/f"]

    added = await cli(tmp_path, database_url, "add", str(DATA / "invert.toml"), "--admins-only")
    assert added.code == 0, added.stderr
    shown = listing(await cli(tmp_path, database_url, "list"))
    assert "[operator]" in shown["/invert"] and "admins only" in shown["/invert"]


async def test_disable_enable_and_shipped_commands_cannot_be_removed(
    tmp_path: Path, database_url: str
) -> None:
    assert (await cli(tmp_path, database_url, "disable", "f")).code == 0
    assert "disabled" in listing(await cli(tmp_path, database_url, "list"))["/f"]
    assert (await cli(tmp_path, database_url, "enable", "/f")).code == 0
    assert "enabled" in listing(await cli(tmp_path, database_url, "list"))["/f"]
    refused = await cli(tmp_path, database_url, "remove", "f")
    assert refused.code == 2 and "disable it instead" in refused.stderr
    unknown = await cli(tmp_path, database_url, "disable", "nope")
    assert unknown.code == 2 and "no command /nope" in unknown.stderr  # a usage error


async def test_a_broken_workflow_is_refused_with_the_reason(
    tmp_path: Path, database_url: str
) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text((DATA / "invert.toml").read_text().replace('node = "1"', 'node = "9"'))
    (tmp_path / "broken.json").write_text((DATA / "invert.json").read_text())
    run = await cli(tmp_path, database_url, "add", str(broken))
    assert run.code == 2
    assert "9" in run.stderr and "Traceback" not in run.stderr


async def test_check_names_what_a_backend_lacks(
    tmp_path: Path, database_url: str, fake_comfy_factory
) -> None:
    bare: FakeComfyUI = await fake_comfy_factory(
        models={"diffusion_models": ["flux1-schnell.safetensors"], "text_encoders": [],
                "vae": [], "checkpoints": [], "loras": []}
    )
    run = await cli(tmp_path, database_url, "check", "--server", bare.url)
    assert run.code == 1
    lines = {line.split()[1]: line for line in run.stdout.splitlines()}
    assert "ae.safetensors" in lines["/f"] and "flux1-schnell" not in lines["/f"]
    assert "sd3.5_large_fp8_scaled.safetensors" in lines["/sd3"]


async def test_check_says_which_outputs_a_no_trace_backend_still_writes_to_disk(
    tmp_path: Path, database_url: str, fake_comfy: FakeComfyUI
) -> None:
    run = await cli(tmp_path, database_url, "check", "--server", fake_comfy.url)
    assert run.code == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    wan = next(i for i, line in enumerate(lines) if "/wan" in line)
    assert lines[wan + 1].strip().startswith("no trace: SaveVideo (node 80) has no in-memory")
    flux = next(i for i, line in enumerate(lines) if "/f " in line)
    assert "no trace" not in lines[flux] + lines[flux + 1]


async def test_check_includes_commands_added_with_workflows_add(
    tmp_path: Path, database_url: str, fake_comfy: FakeComfyUI
) -> None:
    """The bot serves what the database holds: an operator's command is checked too, and
    the exit code says when it cannot run."""
    (tmp_path / "mine.toml").write_text(
        (DATA / "invert.toml").read_text().replace('command = "invert"', 'command = "mine"')
    )
    (tmp_path / "mine.json").write_text(
        (DATA / "invert.json").read_text().replace("ImageInvert", "MadeUpInvert")
    )
    assert (await cli(tmp_path, database_url, "add", str(tmp_path / "mine.toml"))).code == 0
    run = await cli(tmp_path, database_url, "check", "--server", fake_comfy.url)
    lines = {line.split()[1]: line for line in run.stdout.splitlines() if "/" in line}
    assert "MadeUpInvert" in lines["/mine"], run.stdout
    assert "ok" in lines["/f"].split()
    assert run.code == 1


async def test_add_refuses_to_replace_a_command_unless_told_and_says_what_it_replaces(
    tmp_path: Path, database_url: str
) -> None:
    (tmp_path / "other_f.toml").write_text(
        (DATA / "invert.toml").read_text().replace('command = "invert"', 'command = "f"')
    )
    (tmp_path / "other_f.json").write_text((DATA / "invert.json").read_text())
    refused = await cli(tmp_path, database_url, "add", str(tmp_path / "other_f.toml"))
    assert refused.code == 2, refused.stdout + refused.stderr
    assert "/f already runs flux_schnell" in refused.stderr and "--replace" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert "[shipped]" in listing(await cli(tmp_path, database_url, "list"))["/f"]

    replaced = await cli(tmp_path, database_url, "add", str(tmp_path / "other_f.toml"),
                         "--replace")
    assert replaced.code == 0, replaced.stderr
    assert "/f -> other_f" in replaced.stdout and "replacing flux_schnell" in replaced.stdout
    assert "[operator]" in listing(await cli(tmp_path, database_url, "list"))["/f"]
    # Adding the very same workflow again replaces nothing and needs no flag.
    again = await cli(tmp_path, database_url, "add", str(tmp_path / "other_f.toml"))
    assert again.code == 0, again.stderr
    assert "replacing" not in again.stdout


async def test_generate_runs_a_command_added_to_the_database(
    tmp_path: Path, database_url: str, fake_comfy: FakeComfyUI
) -> None:
    """What `/mine` runs in the chat, `comfyveil generate mine` runs too."""
    from tests.e2e.test_generate import png

    (tmp_path / "mine.toml").write_text(
        (DATA / "invert.toml").read_text().replace('command = "invert"', 'command = "mine"')
    )
    (tmp_path / "mine.json").write_text((DATA / "invert.json").read_text())
    (tmp_path / "photo.png").write_bytes(png(8, 8))
    assert (await cli(tmp_path, database_url, "add", str(tmp_path / "mine.toml"))).code == 0
    (tmp_path / "mine.toml").unlink()  # only the database has it now
    run = await run_cli("generate", "mine", "--image", "photo.png", "--server", fake_comfy.url,
                        "--out", "out", "--config", "comfyveil.toml", cwd=tmp_path)
    assert run.code == 0, run.stderr
    assert len(run.stdout.splitlines()) == 1 and (tmp_path / run.stdout.strip()).is_file()
    unknown = await run_cli("generate", "nosuch", "a fox", "--server", fake_comfy.url,
                            "--config", "comfyveil.toml", cwd=tmp_path)
    assert unknown.code == 2 and "nosuch" in unknown.stderr


async def test_add_and_check_say_which_option_is_the_seed_and_warn_of_a_fixed_one(
    tmp_path: Path, database_url: str, fake_comfy: FakeComfyUI
) -> None:
    added = await cli(tmp_path, database_url, "add", str(DATA / "seeded.toml"))
    assert added.code == 0, added.stderr
    assert "seed: --seed (node 3 seed); its default is not used" in added.stdout
    toml = (DATA / "seeded.toml").read_text()
    (tmp_path / "fixed.toml").write_text(
        toml.replace('command = "seeded"', 'command = "fixed"').split("[params.seed]")[0]
    )
    (tmp_path / "fixed.json").write_text((DATA / "seeded.json").read_text())
    fixed = await cli(tmp_path, database_url, "add", str(tmp_path / "fixed.toml"))
    assert fixed.code == 0, fixed.stderr
    assert "seed: none" in fixed.stdout
    assert ("warning: KSampler (node 3) takes its seed from no option: every run with the "
            "same options gives the same image") in fixed.stdout
    run = await cli(tmp_path, database_url, "check", "--server", fake_comfy.url)
    assert run.code == 0, run.stdout + run.stderr
    said = [line.split(None, 1) for line in run.stdout.splitlines() if line.startswith("/")]
    assert ["/wan", "seed: --seed (node 81 noise_seed)"] in said
    assert any(c == "/fixed" and s.startswith("warning: KSampler (node 3)") for c, s in said)


async def test_bench_and_models_check_find_a_command_added_with_workflows_add(
    tmp_path: Path, database_url: str, fake_comfy: FakeComfyUI
) -> None:
    """What `/seeded` runs in the chat, `bench --workflow seeded` measures and `models check
    seeded` checks, as `generate seeded` runs it."""
    assert (await cli(tmp_path, database_url, "add", str(DATA / "seeded.toml"))).code == 0
    config = "comfyveil.toml"  # written by cli(): the database's URL
    bench = await run_cli(
        "bench", "--workflow", "seeded", "--backend", f"gpu={fake_comfy.url}", "--runs", "2",
        "--warmup", "0", "--out", "bench", "--config", config, cwd=tmp_path,
    )
    assert bench.code == 0, bench.stdout + bench.stderr
    assert "seeded" in bench.stdout and "failed" not in bench.stdout
    checked = await run_cli(
        "models", "check", "seeded", "--server", fake_comfy.url, "--config", config,
        cwd=tmp_path,
    )
    assert checked.code == 0, checked.stdout + checked.stderr
    assert "present    checkpoints/flux1-schnell-fp8.safetensors" in checked.stdout
    unknown = await run_cli(
        "bench", "--workflow", "nosuch", "--backend", f"gpu={fake_comfy.url}",
        "--config", config, cwd=tmp_path,
    )
    assert unknown.code == 2 and "nosuch" in unknown.stderr
