"""An embedded PostgreSQL server (the `pgserver` wheel) for installs without DATABASE_URL.

pgserver is blocking (it runs initdb and pg_ctl), so every call goes through
`asyncio.to_thread`. The server listens on a Unix socket inside its data directory only,
never on a TCP port. Several `Database` objects in one process share one server; it is
stopped when the last of them releases it, and pgserver itself leaves it running while
another process still uses it.

Run as root, pgserver runs PostgreSQL as a separate system user (`pgserver`) and, so that
user can reach its files, makes every directory above the data directory and above its
own binaries readable and enterable by every local user; when the socket path would be
too long it puts the socket in a shared directory it sets to 0777, and the server trusts
every local connection. Rather than let it open a private directory (``/root``) or the
database to the machine's other users, `start` refuses then and says what to do.

Its commands (initdb, pg_ctl, and so the server) get a minimal environment (PATH, the
locale, PGDATA), never ours with its tokens; as root they run with the `pgserver` user's
own group and no supplementary group, not root's group 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import stat
import subprocess
import threading
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from comfyveil.store import errors

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_users: dict[Path, int] = {}
_servers: dict[Path, Any] = {}


_OPEN_TO_OTHERS = stat.S_IROTH | stat.S_IXOTH
SOCKET_PATH_MAX = 107  # bytes of a Unix socket path (sun_path less its NUL, Linux)


def closed_to_others(path: Path) -> list[Path]:
    """The directories above `path` that other local users cannot both list and enter."""
    return [p for p in path.parents if p.stat().st_mode & _OPEN_TO_OTHERS != _OPEN_TO_OTHERS]


def check_root_safety(data_dir: Path, binaries: Path) -> None:
    """As root, refuse what pgserver would open to every local user (see the module's
    docstring).

    Raises:
        EmbeddedServerError: a private directory would be opened, or the socket would go
            to a shared directory.
    """
    closed = sorted(set(closed_to_others(data_dir)) | set(closed_to_others(binaries)))
    if closed:
        raise errors.EmbeddedServerError(
            "running as root, the embedded PostgreSQL would make "
            + ", ".join(str(p) for p in closed)
            + " readable by every local user (it runs the database as the user 'pgserver', "
            "which must reach its files). Run comfyveil as a normal user, set DATABASE_URL "
            "(or [database] url) to a PostgreSQL of your own, or keep comfyveil and its "
            "data_dir where other users may already look (for example /opt and /var/lib)"
        )
    if len(os.fsencode(data_dir / ".s.PGSQL.5432")) > SOCKET_PATH_MAX:
        raise errors.EmbeddedServerError(
            f"running as root, the path {data_dir} is too long for the database's socket, "
            "which would then go to a shared directory any local user may connect through; "
            "choose a shorter [database] data_dir"
        )


# What PostgreSQL's programs (initdb, pg_ctl, the server) get of our environment: their
# path and locale, nothing else (not the bot token nor HF_TOKEN, which another process
# of the same user could read in /proc/PID/environ).
KEPT_ENVIRONMENT = ("LANG", "LC_ALL", "LC_CTYPE", "LC_COLLATE", "LC_MESSAGES", "TZ")
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


def server_environment(args: Any) -> dict[str, str]:
    """The environment of one of pgserver's commands: PATH, the locale, PGDATA."""
    env = {"PATH": SAFE_PATH}
    env.update({k: os.environ[k] for k in KEPT_ENVIRONMENT if k in os.environ})
    words = [str(a) for a in args] if isinstance(args, list | tuple) else []
    if "-D" in words[:-1]:
        env["PGDATA"] = words[words.index("-D") + 1]
    return env


def _confined(run: Callable[..., Any]) -> Callable[..., Any]:
    """`subprocess.run` for pgserver's commands: a minimal environment, and when they run
    as another user (we are root), that user's own group and no supplementary group, not
    root's group 0, which subprocess keeps when only `user` is given."""

    def confined(args: Any, *rest: Any, **kwargs: Any) -> Any:
        kwargs["env"] = server_environment(args)
        user = kwargs.get("user")
        if user is not None and os.geteuid() == 0:
            gid = pwd.getpwnam(user).pw_gid
            if gid == 0:
                raise errors.EmbeddedServerError(
                    f"the system user {user} that runs the embedded PostgreSQL has group 0 "
                    "(root); give it a group of its own (usermod -g)"
                )
            kwargs["group"] = gid
            kwargs["extra_groups"] = []
        return run(args, *rest, **kwargs)

    return confined


def _confine(commands: Any) -> None:
    """Route pgserver's command runner (its module's `subprocess.run`) through `_confined`,
    once."""
    current = commands.subprocess
    if getattr(current, "comfyveil_confined", False):
        return
    shim = types.ModuleType("subprocess")
    shim.__dict__.update(subprocess.__dict__)
    shim.run = _confined(subprocess.run)  # type: ignore[attr-defined]
    shim.comfyveil_confined = True  # type: ignore[attr-defined]
    commands.subprocess = shim


def _start(data_dir: Path) -> str:
    with warnings.catch_warnings():
        # platformdirs warns about XDG_RUNTIME_DIR at import; irrelevant here.
        warnings.simplefilter("ignore")
        import pgserver
        from pgserver import _commands

    _confine(_commands)

    data_dir = data_dir.expanduser().resolve()
    with _lock:
        server = _servers.get(data_dir)
        if server is None:
            data_dir.parent.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                # where pgserver keeps its PostgreSQL binaries (its POSTGRES_BIN_PATH)
                check_root_safety(data_dir, Path(pgserver.__file__).parent / "pginstall" / "bin")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                server = pgserver.get_server(data_dir, cleanup_mode="stop")
            _servers[data_dir] = server
        _users[data_dir] = _users.get(data_dir, 0) + 1
        return str(server.get_uri())


def _stop(data_dir: Path) -> None:
    data_dir = data_dir.expanduser().resolve()
    with _lock:
        count = _users.get(data_dir, 0) - 1
        if count > 0:
            _users[data_dir] = count
            return
        _users.pop(data_dir, None)
        server = _servers.pop(data_dir, None)
    if server is not None:
        server.cleanup()


class EmbeddedServer:
    """A handle on the embedded server in one data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.url: str | None = None

    async def start(self) -> str:
        """Start the server (or join the running one) and return its connection URL."""
        if self.url is not None:
            return self.url
        try:
            self.url = await asyncio.to_thread(_start, self.data_dir)
        except errors.EmbeddedServerError:
            raise
        except Exception as exc:  # pgserver raises plain subprocess/OS/assertion errors
            raise errors.EmbeddedServerError(
                f"the embedded PostgreSQL in {self.data_dir} could not be started "
                f"({type(exc).__name__}); see {self.data_dir / 'log'}"
            ) from exc
        logger.info("embedded PostgreSQL ready", extra={"action": "embedded_pg_started"})
        return self.url

    async def stop(self) -> None:
        """Release the server; it stops when nothing else uses it."""
        if self.url is None:
            return
        self.url = None
        try:
            await asyncio.to_thread(_stop, self.data_dir)
        except Exception:  # stopping is best effort; pgserver's atexit hook retries
            logger.warning("the embedded PostgreSQL did not stop cleanly", exc_info=True)
