"""One model file from a Hugging Face hub, verified before it is placed.

huggingface_hub does the talking: `get_hf_file_metadata` (the HEAD on
``{endpoint}/{repo}/resolve/{revision}/{path}``, Hub redirects, retries, its error
classes) and `http_get` (the GET of the file with retries that resume with ``Range``).
They are what `hf_hub_download` runs; we call them directly because `hf_hub_download`
2.x deletes a partial download when it fails (a process-unique temporary file), so a cut
20 GB download would start again from nothing, and because it writes the file before
we could hash it, which would read every byte a second time. Here the bytes go to a
partial file beside the target, kept across runs and resumed from where it stopped,
and through SHA-256 on the way (in a thread of its own, so hashing overlaps the
download); only a file of the right size and hash is renamed into place.

The token (HF_TOKEN, or a token file only its owner can read) is sent to the hub and
nowhere else (huggingface_hub drops it on a redirect to a CDN), and never printed or
logged: it is registered with `comfyveil.redaction`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import httpcore2
import httpx2
import huggingface_hub
from huggingface_hub import errors as hf_errors
from huggingface_hub import file_download
from huggingface_hub import utils as hf_utils

from comfyveil import proxy as comfy_proxy
from comfyveil import redaction
from comfyveil.comfy.manifest import ModelFile
from comfyveil.errors import ComfyveilError
from comfyveil.models import local

__all__ = [
    "ChecksumError",
    "GatedError",
    "HubError",
    "OversizeError",
    "download",
    "endpoint",
    "read_token",
    "session",
    "token_file",
]

logger = logging.getLogger(__name__)

# huggingface_hub hangs a handler of its own on its logger, which writes to stderr past
# the command's logging set-up; its records go through ours (level, redaction) instead.
for _handler in list(logging.getLogger("huggingface_hub").handlers):
    if type(_handler) is logging.StreamHandler:
        logging.getLogger("huggingface_hub").removeHandler(_handler)

# With telemetry on (its default), every request's headers make huggingface_hub fetch a
# registry of "AI agent harnesses" from the address HF_ENDPOINT had when it was imported
# (the Hugging Face Hub, not the mirror an operator names later), and add the agent and
# torch's version to the user agent: a request and details the operator did not ask for.
huggingface_hub.constants.HF_HUB_DISABLE_TELEMETRY = True

DEFAULT_ENDPOINT = "https://huggingface.co"
METADATA_TIMEOUT = 30.0  # seconds for the HEAD (through anon a circuit may be slow to build)
HASH_QUEUE = 4  # chunks (10 MiB each) waiting for the hashing thread at most
# The same for everyone: the default one names Python's and each library's version.
USER_AGENT = f"huggingface_hub/{huggingface_hub.__version__}"


class HubError(ComfyveilError):
    """The model hub did not give the file."""


class GatedError(HubError):
    """The repository is gated: the hub wants a token with access to it."""


class ChecksumError(HubError):
    """The downloaded bytes are not the ones the manifest pins."""


class OversizeError(HubError):
    """The server sent more bytes than the manifest pins (a tampering mirror or CDN)."""


def endpoint() -> str:
    """The hub's address: HF_ENDPOINT (a mirror) when set, else the Hugging Face Hub.
    Read at each call, not at import like huggingface_hub does."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def token_file() -> Path:
    """Where huggingface_hub keeps a token: HF_TOKEN_PATH, else HF_HOME/token, else
    ~/.cache/huggingface/token."""
    if os.environ.get("HF_TOKEN_PATH"):
        return Path(os.environ["HF_TOKEN_PATH"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "token"
    cache = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(cache).expanduser() / "huggingface" / "token"


def read_token() -> str | None:
    """HF_TOKEN, else the token file, else None (public repositories need none).

    Raises:
        HubError: the token file can be read by other users (the token is not sent).
    """
    token = (os.environ.get("HF_TOKEN") or "").strip()
    path = token_file()
    if not token:
        try:
            mode = path.stat().st_mode
        except OSError:
            return None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise HubError(
                f"the token file {path} can be read by other users of this machine; "
                f"make it yours alone with: chmod 600 {path}"
            )
        try:
            token = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise HubError(f"cannot read the token file {path}") from exc
    if not token:
        return None
    redaction.register(token)
    return token


@contextmanager
def session(proxy: str | None) -> Iterator[None]:
    """huggingface_hub's HTTP client for the block: through `proxy` (a socks5h:// URL,
    the host name resolved by the proxy; on a Unix socket as `comfyveil.proxy` writes
    it, which is how our own anon listens) when given, and then deaf to HTTP(S)_PROXY
    and NO_PROXY, which could route around it; else the environment's proxies."""
    socks = comfy_proxy.Socks.parse(proxy) if proxy is not None else None

    def factory() -> httpx2.Client:
        if socks is not None and socks.unix_path is not None:
            return httpx2.Client(
                follow_redirects=True, timeout=None, trust_env=False,
                transport=_UnixSocksTransport(socks),
            )
        return httpx2.Client(
            follow_redirects=True, timeout=None, proxy=proxy, trust_env=proxy is None
        )

    huggingface_hub.set_client_factory(factory)
    try:
        yield
    finally:
        huggingface_hub.set_client_factory(_direct_client)


def _direct_client() -> httpx2.Client:
    return httpx2.Client(follow_redirects=True, timeout=None)


class _UnixBackend(httpcore2.SyncBackend):
    """Every TCP connection httpcore asks for goes to the SOCKS proxy's Unix socket."""

    def __init__(self, path: str) -> None:
        self._path = path

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Any = None) -> httpcore2.NetworkStream:
        return self.connect_unix_socket(self._path, timeout)


class _UnixSocksTransport(httpx2.HTTPTransport):
    """httpx2's transport with its pool swapped for a SOCKS pool that dials a Unix
    socket: httpx2 takes SOCKS proxies on TCP only, httpcore2's SOCKS pool takes any
    network backend (`_pool` is httpx2's own attribute; the version is pinned)."""

    def __init__(self, socks: comfy_proxy.Socks) -> None:
        super().__init__()
        auth = (socks.username or "", socks.password or "") if socks.username else None
        self._pool = httpcore2.SOCKSProxy(
            proxy_url=httpcore2.URL("socks5://localhost:1080/"), proxy_auth=auth,
            network_backend=_UnixBackend(socks.unix_path or ""),
        )


class _NoBar:
    """huggingface_hub's progress bar slot: the CLI draws its own (rich)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, count: float | None = 1) -> None:
        return None

    def close(self) -> None:
        return None


class _HashingWriter:
    """The file object `http_get` writes to: each chunk goes to the partial file and,
    through a bounded queue, to SHA-256 in a thread of its own (hashlib releases the GIL
    on large chunks, so on two cores hashing costs the download nothing)."""

    _RESET = object()

    def __init__(self, handle: Any, prefix: hashlib._Hash, position: int,
                 on_bytes: Callable[[int], None] | None, limit: int) -> None:
        self._handle = handle
        self._limit = limit
        self._digest = prefix
        self._position = position
        self._start = position
        self._on_bytes = on_bytes
        self._queue: queue.Queue[object] = queue.Queue(maxsize=HASH_QUEUE)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._hash, name="sha256", daemon=True)
        self._thread.start()

    def _hash(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if item is self._RESET:
                self._digest = hashlib.sha256()
            else:
                self._digest.update(item)  # type: ignore[arg-type]

    def write(self, data: bytes) -> int:
        # The pinned size bounds what reaches the disk while it comes, not after: a
        # server that sends more is lying, and its bytes are not worth resuming.
        if self._position + len(data) > self._limit:
            raise OversizeError("the server sent more bytes than the manifest pins")
        self._handle.write(data)
        self._queue.put(bytes(data))
        self._position += len(data)
        if self._on_bytes is not None:
            self._on_bytes(len(data))
        return len(data)

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = 0) -> int:
        # http_get rewinds to the start when a server ignores Range (200 instead of 206).
        if whence != 0 or offset != 0:
            raise OSError("a model download can only restart from its first byte")
        self._handle.seek(0)
        self._queue.put(self._RESET)
        if self._on_bytes is not None:
            self._on_bytes(-self._position)
        self._position = 0
        return 0

    def truncate(self, size: int | None = None) -> int:
        return self._handle.truncate(self._position if size is None else size)

    def flush(self) -> None:
        self._handle.flush()

    def hexdigest(self) -> str:
        self._queue.put(None)
        self._thread.join()
        return self._digest.hexdigest()

    def __enter__(self) -> _HashingWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()


def download(
    model: ModelFile, target: Path, *, token: str | None,
    on_bytes: Callable[[int], None] | None = None,
) -> str:
    """Fetch `model` into `target` (atomically), resuming a partial download; returns
    the sha256 it was checked against.

    Blocking: run it in a thread. `on_bytes` hears of every chunk (a resumed part
    counts at once).

    Raises:
        GatedError: the repository wants a token with access (401/403).
        ChecksumError: the bytes are not the manifest's (the download is deleted).
        OversizeError: the server sent more than the pinned size (stopped there, and the
            download is deleted).
        HubError: the hub is unreachable, lacks the file, or serves another size; a
            partial download is kept to resume next time.
    """
    base = endpoint()
    revision = model.revision or "main"
    url = huggingface_hub.hf_hub_url(model.repo, model.path, revision=revision, endpoint=base)
    where = f"{model.repo}/{model.path}@{revision[:12]}"
    headers = {"user-agent": USER_AGENT}
    try:
        meta = huggingface_hub.get_hf_file_metadata(
            url, token=token or False, headers=headers, endpoint=base,
            timeout=METADATA_TIMEOUT, retry_on_errors=True,
        )
    except Exception as exc:  # huggingface_hub and httpx2 raise many kinds
        raise _translated(exc, model, base, where) from exc
    if meta.size is not None and meta.size != model.size:
        raise HubError(
            f"{where} is {meta.size} bytes on the hub, but the manifest pins "
            f"{model.size}; nothing was downloaded"
        )
    etag = (meta.etag or "").lower()
    if len(etag) == 64 and etag != model.sha256 and all(c in "0123456789abcdef" for c in etag):
        raise HubError(
            f"{where} has sha256 {etag} on the hub, but the manifest pins "
            f"{model.sha256}; nothing was downloaded"
        )
    location = meta.location or url
    get_headers = hf_utils.build_hf_headers(token=token or False, headers=headers)
    if _origin(location) != _origin(url):
        get_headers.pop("authorization", None)  # a signed CDN address needs no token

    partial = local.partial_path(target, model)
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = hashlib.sha256()
    done = 0
    if partial.is_file():
        done = partial.stat().st_size
        if done > model.size:
            partial.unlink()
            done = 0
        else:
            with open(partial, "rb", buffering=0) as old:
                while chunk := old.read(local.READ_CHUNK):
                    prefix.update(chunk)
            if on_bytes is not None and done:
                on_bytes(done)
    try:
        with open(partial, "ab") as handle, _HashingWriter(
            handle, prefix, done, on_bytes, model.size
        ) as writer:
            file_download.http_get(
                location, writer, resume_size=done, headers=get_headers,
                expected_size=model.size, displayed_filename=model.filename,
                tqdm_class=_NoBar,  # type: ignore[arg-type]
            )
            handle.flush()
            os.fsync(handle.fileno())  # the bytes are on disk before the name says so
            received = writer.hexdigest()
    except OversizeError:
        partial.unlink(missing_ok=True)
        raise OversizeError(
            f"{model.relative} from {where} is longer than the {model.size} bytes the "
            "manifest pins; the download was deleted and nothing was placed"
        ) from None
    except Exception as exc:
        raise _translated(exc, model, base, where, kept=partial) from exc
    if received != model.sha256:
        partial.unlink(missing_ok=True)
        raise ChecksumError(
            f"{model.relative} from {where} has the wrong bytes: expected sha256 "
            f"{model.sha256}, received {received}; the download was deleted and nothing "
            "was placed"
        )
    partial.replace(target)
    _fsync_dir(target.parent)
    return received


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


def _translated(
    exc: BaseException, model: ModelFile, base: str, where: str, kept: Path | None = None
) -> HubError:
    """One plain sentence for what huggingface_hub or httpx2 raised (their messages
    hold URLs and advice for their own CLI; never the token, which is in a header)."""
    if isinstance(exc, HubError):
        return exc
    resume = ""
    if kept is not None and kept.is_file() and kept.stat().st_size:
        resume = (f"; {local.human_size(kept.stat().st_size)} are kept and the next run "
                  "resumes from there")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, hf_errors.RepositoryNotFoundError) and not isinstance(
        exc, hf_errors.GatedRepoError
    ):
        return HubError(
            f"{model.repo} is not on {base}, or it is private: then put a token with access "
            f"in HF_TOKEN or in {token_file()} (readable by you alone: chmod 600)"
        )
    if isinstance(exc, hf_errors.GatedRepoError) or status in (401, 403):
        return GatedError(
            f"{model.repo} is gated: sign in at {base}/{model.repo} and accept its "
            f"conditions, then make a read token at {base}/settings/tokens and put it in "
            f"HF_TOKEN or in {token_file()} (readable by you alone: chmod 600)"
        )
    if isinstance(exc, hf_errors.RevisionNotFoundError):
        return HubError(f"{model.repo} has no revision {model.revision or 'main'}")
    if isinstance(exc, hf_errors.RemoteEntryNotFoundError) or status == 404:
        return HubError(f"{where} is not on the hub ({base})")
    if isinstance(exc, httpx2.ProxyError):
        return HubError(f"the SOCKS proxy could not reach {base} for {where}{resume}")
    if isinstance(exc, httpx2.HTTPError | OSError) and not isinstance(
        exc, hf_errors.HfHubHTTPError
    ):
        detail = type(exc).__name__ if not isinstance(exc, OSError) else (
            exc.strerror or "the size did not match")
        return HubError(f"downloading {where} from {base} failed ({detail}){resume}")
    if status is not None:
        return HubError(f"the hub answered {status} for {where}{resume}")
    return HubError(f"downloading {where} from {base} failed ({type(exc).__name__}){resume}")
