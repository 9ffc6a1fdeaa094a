"""Install the anon binary from its pinned npm package, checking every file's hash.

`npm pack` fetches the package tarball without running its install script (which
would download more from the internet). We take `bin/<os>/<arch>/anon`,
`anon-gencert`, `geoip` and `geoip6` out of it and refuse anything whose SHA-256
differs from the hashes pinned below.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import platform
import re
import shutil
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from comfyveil import config, config_load
from comfyveil import tasks as background
from comfyveil.anyone import errors

logger = logging.getLogger(__name__)

PACKAGE = "@anyone-protocol/anyone-client"
PACKAGE_VERSION = "1.1.3"
TARBALL_SHA256 = "50521e65998ad3108b13a26df868db539fe4f108d8d8bf4b71130e4c4fe1538f"
FILES = ("anon", "anon-gencert", "geoip", "geoip6")
EXECUTABLES = frozenset({"anon", "anon-gencert"})

# The package's folder for each (system, machine) and the hashes of its files.
PLATFORM_DIRS: Mapping[tuple[str, str], str] = {
    ("linux", "x86_64"): "linux/x64",
    ("linux", "amd64"): "linux/x64",
    ("darwin", "arm64"): "darwin/arm64",
}
PINNED: Mapping[str, Mapping[str, str]] = {
    "linux/x64": {
        "anon": "ec00c60c185530465fa270c05d7b0ebf507fec9ac970f5a58c3be75247101e1c",
        "anon-gencert": "ce09a13c86fa7e604eaf66e06795dea9287bd2a93b19caffb96c64f0a6cebb77",
        "geoip": "36a7482d358171e38ef238f6d234778867ad9d65231ee9bee9e1dbec95a936ae",
        "geoip6": "43e54cc2ebfd573b9051c6cdedba6db3a97666a1a845d793d9360537b78f10dd",
    },
    "darwin/arm64": {
        "anon": "b2962e919d3ce4a87a35091b0cd2e721e396cf5292d1652fbe996cdab7e9a145",
        "anon-gencert": "97a539f4bfaadecc2900eea2d3aa455e0a777e77683b93126ad0d93a183c108a",
        "geoip": "36a7482d358171e38ef238f6d234778867ad9d65231ee9bee9e1dbec95a936ae",
        "geoip6": "43e54cc2ebfd573b9051c6cdedba6db3a97666a1a845d793d9360537b78f10dd",
    },
}
NPM_TIMEOUT = 300.0


@dataclass(frozen=True)
class InstallResult:
    directory: Path
    binary: Path
    version: str
    downloaded: bool  # False when the files were already there with the right hashes


def platform_dir(system: str | None = None, machine: str | None = None) -> str:
    """The package folder holding anon for this machine, or a plain error."""
    system = (system or platform.system()).lower()
    machine = (machine or platform.machine()).lower()
    if system == "linux" and machine in {"aarch64", "arm64"}:
        raise errors.UnsupportedPlatform(
            f"the {PACKAGE} {PACKAGE_VERSION} package has no anon binary for linux/arm64; "
            "install anon yourself and set ANON_BINARY (or [anyone] binary) to its path"
        )
    try:
        return PLATFORM_DIRS[(system, machine)]
    except KeyError:
        raise errors.UnsupportedPlatform(
            f"there is no pinned anon binary for {system}/{machine}; "
            "install anon yourself and set ANON_BINARY (or [anyone] binary) to its path"
        ) from None


def default_dir(settings: config.Settings) -> Path:
    return settings.data_dir / "anon"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def mismatched_files(directory: Path, plat: str | None = None) -> list[str]:
    """Names of the pinned files that are missing from `directory` or differ from their hash."""
    pinned = PINNED[plat or platform_dir()]
    bad = []
    for name in FILES:
        path = directory / name
        if not path.is_file() or sha256_file(path) != pinned[name]:
            bad.append(name)
    return bad


def find_binary(settings: config.Settings | None = None, environ: Mapping[str, str] | None = None,
                ) -> Path:
    """The anon binary to run: [anyone] binary, else ANON_BINARY, else the installed one."""
    env = os.environ if environ is None else environ
    settings = settings or config_load.load(environ=env)
    if settings.anyone.binary:
        path = settings.anyone.binary
    elif env.get("ANON_BINARY"):
        path = Path(env["ANON_BINARY"])
    else:
        path = default_dir(settings) / "anon"
    if path.is_file() and os.access(path, os.X_OK):
        return path
    raise errors.AnonNotInstalled(
        f"no anon binary at {path}; run: comfyveil anon install "
        "(or set ANON_BINARY to an anon binary you have)"
    )


async def anon_version(binary: Path) -> str:
    """What `anon --version` says, e.g. '0.4.9.11-live'."""
    try:
        proc = await asyncio.create_subprocess_exec(
            str(binary), "--version",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await background.wait_for(proc.communicate(), 30)
    except (OSError, TimeoutError) as exc:
        raise errors.AnonError(f"cannot run {binary} --version: {exc}") from exc
    match = re.search(r"version\s+(\S+?)\.?\s", out.decode(errors="replace") + " ")
    if proc.returncode != 0 or not match:
        raise errors.AnonError(f"{binary} --version did not print a version")
    return match.group(1)


async def _npm_pack(npm: str, workdir: Path) -> Path:
    spec = f"{PACKAGE}@{PACKAGE_VERSION}"
    logger.info("fetching %s with npm pack", spec)
    try:
        proc = await asyncio.create_subprocess_exec(
            npm, "pack", spec, "--ignore-scripts", "--silent",
            cwd=workdir, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        _, err = await background.wait_for(proc.communicate(), NPM_TIMEOUT)
    except TimeoutError as exc:
        raise errors.AnonError(f"npm pack {spec} took longer than {NPM_TIMEOUT:.0f} s") from exc
    except OSError as exc:
        raise errors.AnonError(f"cannot run npm: {exc.strerror}") from exc
    if proc.returncode != 0:
        last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise errors.AnonError(f"npm pack {spec} failed: {last}")
    tarballs = sorted(await asyncio.to_thread(lambda: list(workdir.glob("*.tgz"))))
    if len(tarballs) != 1:
        raise errors.AnonError(f"npm pack {spec} did not leave one .tgz file")
    return tarballs[0]


def _extract(tarball: Path, plat: str, target: Path) -> None:
    """Copy the pinned files out of the tarball into `target`, atomically per file."""
    digest = sha256_file(tarball)
    if digest != TARBALL_SHA256:
        raise errors.IntegrityError(
            f"the {PACKAGE} {PACKAGE_VERSION} tarball has SHA-256 {digest[:16]}..., "
            f"expected {TARBALL_SHA256[:16]}...; refusing to install it"
        )
    pinned = PINNED[plat]
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball, "r:gz") as archive:
        for name in FILES:
            member_name = f"package/bin/{plat}/{name}"
            try:
                member = archive.getmember(member_name)
                source = archive.extractfile(member)
            except KeyError:
                source = None
            if source is None:
                raise errors.IntegrityError(f"the tarball has no {member_name}")
            partial = target / f".{name}.partial"
            digest_obj = hashlib.sha256()
            with source, partial.open("wb") as out:
                for chunk in iter(lambda src=source: src.read(1 << 20), b""):
                    digest_obj.update(chunk)
                    out.write(chunk)
            if digest_obj.hexdigest() != pinned[name]:
                partial.unlink()
                raise errors.IntegrityError(
                    f"{member_name} does not match its pinned SHA-256; refusing to install it"
                )
            partial.chmod(0o755 if name in EXECUTABLES else 0o644)
            partial.replace(target / name)


async def install(
    target: Path,
    *,
    tarball: Path | None = None,
    npm: str | None = None,
    force: bool = False,
) -> InstallResult:
    """Install anon into `target` (idempotent: nothing is fetched when the hashes match)."""
    plat = platform_dir()
    target = await asyncio.to_thread(lambda: target.expanduser().resolve())
    if not force and tarball is None:
        bad = await asyncio.to_thread(mismatched_files, target, plat)
        if not bad:
            version = await anon_version(target / "anon")
            return InstallResult(target, target / "anon", version, downloaded=False)
    with tempfile.TemporaryDirectory(prefix="comfyveil-anon-") as tmp:
        if tarball is None:
            npm_path = npm or shutil.which("npm")
            if not npm_path:
                raise errors.AnonNotInstalled(
                    "npm is not installed, so the anon package cannot be fetched; install "
                    "Node.js with npm, or set ANON_BINARY to an anon binary you already have"
                )
            tarball = await _npm_pack(npm_path, Path(tmp))
        await asyncio.to_thread(_extract, tarball, plat, target)
    version = await anon_version(target / "anon")
    logger.info("installed anon %s into %s", version, target)
    return InstallResult(target, target / "anon", version, downloaded=True)
