"""deploy/: the systemd units pass `systemd-analyze verify` and score "OK" (at most 3.0)
in `systemd-analyze security`; the Prometheus alerts parse and name only our metrics."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from comfyveil import metrics

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
MAX_EXPOSURE = 3.0
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None,
    reason="systemd-analyze is missing (Debian's systemd package; `make test` installs it)",
)


def test_every_kind_of_host_has_its_unit() -> None:
    assert {u.name for u in UNITS} == {
        "comfyveil.service",
        "comfyveil-worker@.service",
        "comfyveil-expose@.service",
        "comfyui.service",
    }


def _checkable(unit: Path, into: Path) -> Path:
    """The unit as systemd-analyze can check it here: its programs (installed under /opt
    on a real host) point at ones that exist, a template gets an instance name."""
    text = unit.read_text()
    text = text.replace(
        "/opt/comfyveil/.venv/bin/comfyveil", str(Path(sys.executable).parent / "comfyveil")
    )
    text = text.replace("/opt/ComfyUI/venv/bin/python", sys.executable)
    name = unit.name.replace("@.service", "@gpu1.service")
    into.chmod(0o755)
    target = into / name
    target.write_text(text)
    return target


@needs_systemd
@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_systemd_analyze_verify_accepts_the_unit(unit: Path, tmp_path: Path) -> None:
    checked = _checkable(unit, tmp_path)
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", f"./{checked.name}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr


@needs_systemd
@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_systemd_analyze_security_scores_the_unit_ok(unit: Path, tmp_path: Path) -> None:
    checked = _checkable(unit, tmp_path)
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=yes", "--no-pager", f"./{checked.name}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", result.stdout)
    assert match is not None, result.stdout + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE and match.group(2) == "OK", result.stdout


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_units_take_no_secret_from_their_environment(unit: Path) -> None:
    text = unit.read_text()
    assert "COMFYVEIL_TELEGRAM_TOKEN" not in text and "DATABASE_URL=" not in text
    assert "DynamicUser=yes" in text and "NoNewPrivileges=yes" in text


def test_the_bot_token_comes_as_a_credential_and_services_report_readiness() -> None:
    main = (ROOT / "deploy" / "systemd" / "comfyveil.service").read_text()
    assert "LoadCredential=telegram-token:" in main
    for name in ("comfyveil.service", "comfyveil-worker@.service"):
        text = (ROOT / "deploy" / "systemd" / name).read_text()
        assert "Type=notify" in text and "WatchdogSec=" in text
    comfyui = (ROOT / "deploy" / "systemd" / "comfyui.service").read_text()
    assert "--temp-directory %t/comfyui" in comfyui and "RuntimeDirectory=comfyui" in comfyui


def exposed_sample_names() -> set[str]:
    """Every sample name the registry can expose (a labelled metric may have no sample yet)."""
    names = set()
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "gauge": ("",),
        "info": ("_info",),
    }
    for family in metrics.REGISTRY.collect():
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
    return names


def alert_rules() -> list[dict[str, object]]:
    document = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_alerts_parse_and_name_only_metrics_that_exist() -> None:
    rules = alert_rules()
    assert {r["alert"] for r in rules} == {
        "ComfyveilNoWorkerAlive",
        "ComfyveilAllBackendsDown",
        "ComfyveilJobFailureRatioHigh",
        "ComfyveilTelegramFloodControl",
    }
    exposed = exposed_sample_names()
    for rule in rules:
        expr = str(rule["expr"])
        named = set(re.findall(r"\b[a-z_]+(?=[{\[)\s]|$)", expr)) - {
            "sum",
            "max",
            "increase",
            "rate",
            "by",
            "and",
            "or",
            "on",
        }
        named = {n for n in named if "_" in n}
        assert named, expr
        assert named <= exposed, named - exposed


def test_the_docs_document_every_metric() -> None:
    readme = (ROOT / "docs" / "run" / "monitoring.md").read_text()
    for name in metrics.NAMES:
        family = next(f for f in metrics.REGISTRY.collect() if f.name == name)
        shown = name + ("_total" if family.type == "counter" else "")
        assert f"`{shown}" in readme, shown


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_the_configuration_directory_is_roots_alone(unit: Path) -> None:
    """Settings may hold a database password: /etc/comfyveil is 0700, and a service of a
    user made at start reads its settings as a credential (%d), not from /etc."""
    text = unit.read_text()
    if "ConfigurationDirectory=" in text:
        assert "ConfigurationDirectoryMode=0700" in text
    for flag in re.findall(r"--config (\S+)", text):
        assert flag.startswith("%d/"), flag
        assert f"LoadCredential={flag.removeprefix('%d/')}:/etc/comfyveil/" in text
