"""The small parts of operating it: [metrics] and [log] settings, systemd credentials,
sd_notify, JSON log lines (redacted like the text ones), what the metrics count."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from comfyveil import config, config_load, logs, metrics, redaction, sdnotify
from comfyveil.cli import _subcommand

TOKEN = "123456:ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghij"


def test_metrics_are_off_by_default_on_loopback_and_their_own_port() -> None:
    settings = config_load.from_mapping({}, environ={})
    assert settings.metrics == config.MetricsConfig(False, "127.0.0.1", 9464)
    assert settings.log.format == "text"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"metrics": {"port": 70000}}, "[metrics] port must be a whole number from 0 to 65535"),
        ({"metrics": {"enabled": "yes"}}, "[metrics] enabled must be true or false"),
        ({"metrics": {"host": "abc.anon"}}, "never a hidden service"),
        ({"metrics": {"enabled": True, "port": 8080}}, "the metrics need their own port"),
        ({"log": {"format": "xml"}}, "[log] format must be one of text, json"),
        ({"metrics": {"path": "/m"}}, "unknown key(s) in [metrics]: path"),
    ],
)
def test_bad_metrics_and_log_settings_are_refused_in_plain_words(
    table: dict[str, object], message: str
) -> None:
    with pytest.raises(config.ConfigError) as caught:
        config_load.from_mapping(table, environ={})
    assert message in str(caught.value)


def test_token_and_database_url_come_from_systemd_credentials(tmp_path: Path) -> None:
    (tmp_path / "telegram-token").write_text(TOKEN + "\n")
    (tmp_path / "database-url").write_text("postgresql://u:secret@db/comfyveil\n")
    settings = config_load.from_mapping({}, environ={"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert settings.telegram.token == TOKEN
    assert settings.database.url == "postgresql://u:secret@db/comfyveil"
    # The environment still wins, as before (an operator's explicit choice).
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path), "COMFYVEIL_TELEGRAM_TOKEN": "1:x" * 3}
    assert config_load.from_mapping({}, environ=env).telegram.token == "1:x" * 3
    # No credentials directory, or no such credential: as without systemd.
    assert config_load.from_mapping({}, environ={}).telegram.token is None
    (tmp_path / "telegram-token").unlink()
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path)}
    assert config_load.from_mapping({}, environ=env).telegram.token is None


def test_log_format_value_is_not_taken_for_the_subcommand() -> None:
    assert _subcommand(["--log-format", "json", "worker", "--id", "x"]) == "worker"
    assert _subcommand(["-v", "run"]) == "run"


def _record(msg: str, *args: object, exc: BaseException | None = None, **extra: object):
    redaction.install()
    logger = logging.getLogger("comfyveil.test")
    exc_info = (type(exc), exc, exc.__traceback__) if exc else None
    return logger.makeRecord(
        logger.name, logging.WARNING, __file__, 1, msg, args, exc_info, extra=extra
    )


def test_json_lines_carry_the_extra_fields_and_are_redacted_like_text() -> None:
    redaction.register(TOKEN)
    try:
        raise RuntimeError(f"https://api.telegram.org/bot{TOKEN}/getMe failed")
    except RuntimeError as exc:
        record = _record(
            "sending with %s",
            TOKEN,
            exc=exc,
            action="job_claimed",
            job_id="j1",
            detail=f"url bot{TOKEN}",
        )
    line = logs.formatter("json").format(record)
    data = json.loads(line)
    assert "\n" not in line
    assert data["level"] == "WARNING" and data["logger"] == "comfyveil.test"
    assert data["action"] == "job_claimed" and data["job_id"] == "j1"
    assert data["message"] == f"sending with {redaction.MASK}"
    assert "exc_info" in data and "RuntimeError" in data["exc_info"]
    assert TOKEN not in line and "ABCDEFGHIJ" not in line
    text = logs.formatter("text").format(record)
    assert TOKEN not in text and redaction.MASK in text


def test_log_format_from_settings_only_when_the_command_line_chose_none() -> None:
    root = logging.getLogger()
    handler = logging.StreamHandler()
    root.addHandler(handler)
    try:
        json_settings = SimpleNamespace(log=SimpleNamespace(format="json"))
        logs.configure(logging.WARNING, "text")  # --log-format text
        logs.apply_settings(json_settings)
        assert not isinstance(handler.formatter, logs.RedactingJsonFormatter)
        logs.configure(logging.WARNING, None)
        logs.apply_settings(json_settings)
        assert isinstance(handler.formatter, logs.RedactingJsonFormatter)
    finally:
        root.removeHandler(handler)


def test_sd_notify_sends_one_datagram_to_the_notify_socket(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(path))
        assert sdnotify.notify("READY=1", {"NOTIFY_SOCKET": str(path)})
        assert server.recv(100) == b"READY=1"
    assert not sdnotify.notify("READY=1", {})  # not under systemd: nothing happens
    assert not sdnotify.notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "gone")})


def test_watchdog_interval_is_half_of_watchdog_sec_for_this_process_only() -> None:
    own = {"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": str(os.getpid())}
    assert sdnotify.watchdog_interval(own) == 30.0
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "1"}) is None
    assert sdnotify.watchdog_interval({}) is None


def _job(status: str, *, attempts: int = 1, backend: str | None = "gpu0") -> SimpleNamespace:
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return SimpleNamespace(
        status=status,
        command="f",
        backend=backend,
        attempts=attempts,
        created_at=start,
        started_at=start + dt.timedelta(seconds=3),
        executing_at=None if backend is None else start + dt.timedelta(seconds=5),
        finished_at=start + dt.timedelta(seconds=10),
    )


def _value(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def test_jobs_are_counted_at_their_end_and_a_retry_is_not_an_end() -> None:
    before = {o: _value("comfyveil_jobs_total", command="f", outcome=o) for o in metrics.OUTCOMES}
    runs = _value("comfyveil_job_run_seconds_count", backend="gpu0", command="f")
    run_sum = _value("comfyveil_job_run_seconds_sum", backend="gpu0", command="f")
    gpu_wait_sum = _value("comfyveil_job_gpu_wait_seconds_sum", backend="gpu0", command="f")
    waits = _value("comfyveil_job_wait_seconds_count", command="f")
    metrics.job_ended(_job("succeeded"))
    metrics.job_ended(_job("queued"))  # a transient failure: back in the queue
    metrics.job_ended(_job("cancelled", backend=None))
    metrics.job_claimed(_job("running"))
    metrics.job_claimed(_job("running", attempts=2))  # a retry waited for its backoff
    after = {o: _value("comfyveil_jobs_total", command="f", outcome=o) for o in metrics.OUTCOMES}
    assert {o: after[o] - before[o] for o in after} == {
        "succeeded": 1,
        "failed": 0,
        "cancelled": 1,
        "refused": 0,
    }
    assert _value("comfyveil_jobs_total", command="f", outcome="queued") == 0
    assert _value("comfyveil_job_run_seconds_count", backend="gpu0", command="f") == runs + 1
    # Running from ComfyUI's start (5 s), as the front ends show it, not from the claim (3 s):
    # the 2 s between were spent waiting on the GPU side.
    assert _value("comfyveil_job_run_seconds_sum", backend="gpu0", command="f") == run_sum + 5
    assert (
        _value("comfyveil_job_gpu_wait_seconds_sum", backend="gpu0", command="f")
        == gpu_wait_sum + 2
    )
    assert _value("comfyveil_job_wait_seconds_count", command="f") == waits + 1


def test_telegram_method_label_never_holds_the_token_or_a_file_path() -> None:
    from comfyveil.telegram.request import _method

    assert _method(f"https://api.telegram.org/bot{TOKEN}/sendPhoto") == "sendPhoto"
    assert _method(f"https://api.telegram.org/file/bot{TOKEN}/photos/file_7.jpg") == "file"
    assert _method(f"http://127.0.0.1:1/bot{TOKEN}/") == "other"
