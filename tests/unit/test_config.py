from __future__ import annotations

from pathlib import Path

import pytest

from comfyveil import config, config_load
from comfyveil.errors import ConfigError


def test_defaults_without_a_file_point_at_local_comfyui(tmp_path: Path) -> None:
    settings = config_load.load(environ={"COMFYVEIL_DATA_DIR": str(tmp_path)})
    (backend,) = settings.backend_list()
    assert backend.url == "http://127.0.0.1:8188"
    assert settings.database.url is None
    assert settings.database_dir == tmp_path / "postgres"


def test_full_file_is_read_and_relative_paths_resolve_beside_it(tmp_path: Path) -> None:
    token = tmp_path / "bot.token"
    token.write_text("123:SECRET\n")
    token.chmod(0o600)
    cfg = tmp_path / "comfyveil.toml"
    cfg.write_text(
        """
data_dir = "state"
[telegram]
token_file = "bot.token"
admins = [1]
allow = [2, -100]
[[backends]]
name = "gpu0"
url = "http://127.0.0.1:8188/"
[[backends]]
name = "remote"
url = "http://abc.anon"
auth_key_file = "keys/remote.auth_private"
[limits]
daily_quota = 5
"""
    )
    settings = config_load.load(cfg, environ={})
    assert settings.data_dir == tmp_path / "state"
    assert settings.telegram.token == "123:SECRET"
    assert settings.telegram.admins == (1,)
    assert [b.name for b in settings.backends] == ["gpu0", "remote"]
    assert settings.backends[0].url == "http://127.0.0.1:8188"
    assert settings.backends[1].auth_key_file == tmp_path / "keys/remote.auth_private"
    assert settings.limits.daily_quota == 5
    assert "SECRET" not in repr(settings)


def test_environment_wins_for_secrets_and_database(tmp_path: Path) -> None:
    settings = config_load.from_mapping(
        {"database": {"url": "postgresql://file"}},
        environ={"DATABASE_URL": "postgresql://env", "COMFYVEIL_TELEGRAM_TOKEN": "1:ENV"},
    )
    assert settings.database.url == "postgresql://env"
    assert settings.telegram.token == "1:ENV"


def test_token_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "bot.token"
    token.write_text("123:SECRET")
    token.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        config_load.from_mapping({"telegram": {"token_file": str(token)}}, environ={})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"telegram": {"tokn_file": "x"}},
         r"unknown key\(s\) in \[telegram\]: tokn_file \(did you mean token_file\?\)"),
        ({"worker": {"grace": 3}}, r"unknown key\(s\) in \[worker\]: grace$"),
        ({"backends": [{"name": "a"}]}, "has no url"),
        ({"backends": [{"url": "ftp://x"}]}, "must start with http"),
        ({"backends": [{"url": "http://a"}, {"url": "http://b", "name": "gpu0"}]},
         "two backends are named gpu0"),
        # One key style in every message: [section] key, as the file spells them.
        ({"anyone": {"control": "127.0.0.1:1"}}, r"\[anyone\] control needs \[anyone\] socks"),
        ({"web": {"port": 70000}}, r"^\[web\] port must be"),
        ({"web": {"session_hours": 0}}, r"^\[web\] session_hours must be"),
        ({"anyone": {"socks": "127.0.0.1:1", "private_network": "n"}}, "cannot both be set"),
        ({"telegram": {"admins": ["me"]}}, "numeric Telegram ids"),
        ({"api": {"enable": False}},
         r"unknown key\(s\) in \[api\]: enable \(did you mean enabled\?\)"),
        ({"api": {"enabled": "no"}}, r'^\[api\] enabled must be true or false, got "no"$'),
        ({"api": True}, r"api must be a table: \[api\]"),
        ({"apii": {}}, r"apii \(did you mean api\?\)"),
    ],
)
def test_mistakes_are_refused_with_a_sentence(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_load.from_mapping(raw, environ={})


def test_missing_explicit_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        config_load.load(tmp_path / "nope.toml", environ={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[telegram\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        config_load.load(bad, environ={})


def test_the_documented_example_file_loads_and_states_the_defaults() -> None:
    example = Path(__file__).parents[2] / "comfyveil.example.toml"
    settings = config_load.load(example, environ={})
    defaults = config_load.from_mapping({}, environ={})
    assert settings.limits == defaults.limits
    assert settings.worker == defaults.worker
    assert settings.telegram == defaults.telegram
    assert settings.anyone == defaults.anyone
    assert settings.web == defaults.web
    assert settings.policy == defaults.policy
    assert settings.metrics == defaults.metrics
    assert settings.log == defaults.log


def test_web_section_is_read_and_checked() -> None:
    settings = config_load.from_mapping(
        {"web": {"port": 9000, "hidden_service": True, "client_auth": ["alice"]}}, environ={}
    )
    assert settings.web.port == 9000 and settings.web.hidden_service
    assert settings.web.client_auth == ("alice",)
    assert config_load.from_mapping({}, environ={}).web.enabled
    with pytest.raises(config.ConfigError, match=r"\[web\] port"):
        config_load.from_mapping({"web": {"port": "x"}}, environ={})
    with pytest.raises(config.ConfigError, match="unknown key"):
        config_load.from_mapping({"web": {"colour": "red"}}, environ={})
    cost = {"passphrase_memory_mib": 19, "passphrase_iterations": 2}
    settings = config_load.from_mapping({"web": cost}, environ={})
    assert (settings.web.passphrase_memory_mib, settings.web.passphrase_iterations) == (19, 2)
    for wrong in ({"passphrase_memory_mib": 0}, {"passphrase_iterations": "3"},
                  {"passphrase_memory_mib": 1.5}, {"passphrase_iterations": True}):
        with pytest.raises(config.ConfigError, match="whole number"):
            config_load.from_mapping({"web": wrong}, environ={})


def test_private_network_file_is_relative_to_the_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "comfyveil.toml"
    cfg.write_text('[anyone]\nprivate_network = "net/authorities.txt"\n')
    settings = config_load.load(cfg, environ={})
    assert settings.anyone.private_network == tmp_path / "net" / "authorities.txt"
    assert config_load.from_mapping({}, environ={}).anyone.private_network is None


def test_default_data_dir_keeps_root_out_of_its_home() -> None:
    home = Path.home() / ".local" / "share" / "comfyveil"
    assert config.default_data_dir({}, euid=1000) == home
    assert config.default_data_dir({}, euid=0) == Path("/var/lib/comfyveil")
    assert config.default_data_dir({"XDG_DATA_HOME": "/x"}, euid=0) == Path("/x/comfyveil")
    assert config.default_data_dir({"COMFYVEIL_DATA_DIR": "/d"}, euid=0) == Path("/d")


def test_no_trace_is_on_for_every_backend_unless_turned_off(tmp_path: Path) -> None:
    cfg = tmp_path / "comfyveil.toml"
    cfg.write_text(
        '[[backends]]\nname = "a"\nurl = "http://127.0.0.1:8188"\n\n'
        '[[backends]]\nname = "b"\nurl = "http://127.0.0.1:8189"\nno_trace = false\n'
    )
    a, b = config_load.load(cfg, environ={}).backends
    assert a.no_trace is True and b.no_trace is False
    assert config_load.from_mapping({}, environ={}).backend_list()[0].no_trace is True
    for value, held in (('"temp"', True), ('"memory"', "memory")):
        cfg.write_text(f'[[backends]]\nurl = "http://127.0.0.1:8188"\nno_trace = {value}\n')
        assert config_load.load(cfg, environ={}).backends[0].no_trace == held
    cfg.write_text('[[backends]]\nurl = "http://127.0.0.1:8188"\nno_trace = "false"\n')
    with pytest.raises(
        config.ConfigError, match='no_trace must be true, false, "temp", "memory", got "false"'
    ):
        config_load.load(cfg, environ={})


def test_the_images_api_is_served_unless_switched_off() -> None:
    assert config_load.from_mapping({}, environ={}).api.enabled
    assert not config_load.from_mapping({"api": {"enabled": False}}, environ={}).api.enabled


def test_a_database_password_in_a_file_others_can_read_is_refused(tmp_path: Path) -> None:
    conf = tmp_path / "comfyveil.toml"
    conf.write_text('[database]\nurl = "postgresql://cv:s3cret@db.internal/cv"\n')
    conf.chmod(0o644)  # what `cp` leaves
    with pytest.raises(config.ConfigError, match="chmod 600") as refused:
        config_load.load(conf, environ={})
    assert "s3cret" not in str(refused.value) and "url_file" in str(refused.value)
    conf.chmod(0o600)
    assert config_load.load(conf, environ={}).database.url == "postgresql://cv:s3cret@db.internal/cv"
    # without a password the file may stay readable (peer or certificate authentication)
    conf.write_text('[database]\nurl = "postgresql://cv@db.internal/cv"\n')
    conf.chmod(0o644)
    assert config_load.load(conf, environ={}).database.url == "postgresql://cv@db.internal/cv"
    # the URL from a file only its owner can read
    secret = tmp_path / "database-url"
    secret.write_text("host=db.internal user=cv password=s3cret\n")
    secret.chmod(0o640)
    conf.write_text(f'[database]\nurl_file = "{secret}"\n')
    with pytest.raises(config.ConfigError, match="readable by others"):
        config_load.load(conf, environ={})
    secret.chmod(0o600)
    loaded = config_load.load(conf, environ={})
    assert loaded.database.url == "host=db.internal user=cv password=s3cret"


def test_a_backends_client_key_comes_as_a_credential_under_dynamic_user(tmp_path: Path) -> None:
    """Under DynamicUser= the service's user exists only while it runs: a key file owned
    by root 0600 is out of its reach and 0644 is refused. With the settings and the key as
    credentials (LoadCredential=, files 0400 of the service's user in a 0500 directory),
    a relative auth_key_file is read from $CREDENTIALS_DIRECTORY beside the settings."""
    import base64

    from comfyveil.anyone import runtime

    credentials = tmp_path / "credentials"
    credentials.mkdir()
    key = credentials / "gpu1.auth_private"
    key.write_text("a" * 56 + ":descriptor:x25519:" + base64.b32encode(bytes(range(32))).decode())
    conf = credentials / "comfyveil.toml"
    conf.write_text(
        '[[backends]]\nname = "gpu1"\nurl = "http://' + "b" * 56 + '.anon:8188"\n'
        'via = "anyone"\nauth_key_file = "gpu1.auth_private"\n'
    )
    for path in (key, conf):
        path.chmod(0o400)
    credentials.chmod(0o500)
    try:
        settings = config_load.load(conf, environ={"CREDENTIALS_DIRECTORY": str(credentials)})
        assert settings.backends[0].auth_key_file == key
        assert runtime._key_files(settings, ()) == [key]  # accepted before anon starts
    finally:
        credentials.chmod(0o700)
