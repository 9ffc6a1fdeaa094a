"""A protocol-faithful fake Hugging Face hub: what `hf_hub_download` (huggingface_hub 2.4)
and `comfyveil models install` ask of it for a file at a pinned revision.

    HEAD/GET {endpoint}/{owner}/{name}/resolve/{revision}/{path}
        an LFS file answers 302 to the CDN, with X-Repo-Commit (the commit), X-Linked-Etag
        (the file's sha256, quoted), X-Linked-Size, ETag (a git blob id, as the hub sends)
        and Content-Length of the redirect's small body; huggingface_hub reads the
        metadata from this very answer and does not follow the redirect on HEAD.
        "main" resolves to the file's commit; another revision that is not its commit
        answers 404 RevisionNotFound; an unknown path 404 EntryNotFound; an unknown
        repository 401 RepoNotFound (the hub's answer to a visitor without a token);
        a gated repository 401 GatedRepo without a token, 403 GatedRepo with a token
        that has no access.
    GET {cdn}/cdn/{sha256}   (on a port of its own: the CDN is another host)
        the bytes: 200 with Content-Length, ETag, Accept-Ranges; with ``Range: bytes=N-``
        206 with Content-Range.

Faults for tests: `cut_after` (bytes; the next `cuts` GETs of the CDN end the
connection after that many body bytes), `down` (the CDN answers 503;
`down_after_cut` sets it at a cut, so a whole run fails), `corrupt` (a
byte offset flipped in what is sent, as a tampering mirror would), `oversize` (more
bytes than the file, chunked, as a CDN filling a disk would). It counts what it
sends per file (`sent`) and records each request (`requests`).

Run alone (benchmarks): ``python -m tests.fakes.hf_hub --file REPO PATH FILE ...``
prints its port and serves until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import re
import secrets
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

CHUNK = 1024 * 1024
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass
class FakeFile:
    repo: str
    path: str
    data: bytes | Path  # bytes, or a file served in chunks (the benchmark's 1 GiB)
    sha256: str
    size: int
    commit: str
    blob_id: str  # the git id of the LFS pointer, which the hub sends as ETag


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorized: bool
    host: str


@dataclass
class FakeHub:
    files: dict[tuple[str, str], FakeFile] = field(default_factory=dict)
    gated: dict[str, str] = field(default_factory=dict)  # repo -> the token with access
    sent: Counter[str] = field(default_factory=Counter)  # sha256 -> body bytes sent
    requests: list[Request] = field(default_factory=list)
    cut_after: int | None = None
    cuts: int = 0
    down: bool = False
    corrupt: int | None = None
    down_after_cut: bool = False  # a cut leaves the CDN down (503) until `down` is reset
    # The CDN sends this many bytes more than the file, chunked (no Content-Length), as a
    # tampering mirror or CDN filling the disk would.
    oversize: int = 0
    url: str = ""
    cdn_url: str = ""
    public_cdn_url: str = ""
    _runners: list[web.AppRunner] = field(default_factory=list)

    def add(self, repo: str, path: str, data: bytes | Path, *, commit: str | None = None,
            sha256: str | None = None) -> FakeFile:
        if isinstance(data, bytes):
            sha256 = sha256 or hashlib.sha256(data).hexdigest()
            size = len(data)
        else:
            size = data.stat().st_size
            if sha256 is None:
                digest = hashlib.sha256()
                with open(data, "rb") as handle:
                    while chunk := handle.read(CHUNK * 8):
                        digest.update(chunk)
                sha256 = digest.hexdigest()
        item = FakeFile(
            repo=repo, path=path, data=data, sha256=sha256, size=size,
            commit=commit or secrets.token_hex(20), blob_id=secrets.token_hex(20),
        )
        self.files[(repo, path)] = item
        return item

    def gate(self, repo: str, token: str) -> None:
        self.gated[repo] = token

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> FakeHub:
        hub = web.Application()
        hub.router.add_route("*", "/{owner}/{name}/resolve/{revision}/{path:.+}", self._resolve)
        cdn = web.Application()
        cdn.router.add_route("*", "/cdn/{sha256}", self._cdn)
        self.url = await self._serve(hub, host, port)
        self.cdn_url = await self._serve(cdn, host, 0)
        return self

    async def _serve(self, app: web.Application, host: str, port: int) -> str:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self._runners.append(runner)
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://{host}:{bound}"

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def cdn_port(self) -> int:
        return int(self.cdn_url.rsplit(":", 1)[1])

    async def close(self) -> None:
        for runner in self._runners:
            await runner.cleanup()

    def _record(self, request: web.Request) -> None:
        self.requests.append(Request(
            request.method, request.path, request.headers.get("Range"),
            "Authorization" in request.headers, request.headers.get("Host", ""),
        ))

    def _error(self, status: int, code: str, message: str) -> web.Response:
        return web.Response(
            status=status, text=f'{{"error":"{message}"}}', content_type="application/json",
            headers={"X-Error-Code": code, "X-Error-Message": message},
        )

    async def _resolve(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        repo = f"{request.match_info['owner']}/{request.match_info['name']}"
        revision = request.match_info["revision"]
        path = request.match_info["path"]
        known = {r for r, _p in self.files}
        if repo not in known:
            return self._error(401, "RepoNotFound", "Repository not found")
        if repo in self.gated:
            auth = request.headers.get("Authorization", "")
            if not auth:
                return self._error(
                    401, "GatedRepo",
                    f"Access to model {repo} is restricted. You must have access to it "
                    "and be authenticated to access it. Please log in.",
                )
            if auth != f"Bearer {self.gated[repo]}":
                return self._error(
                    403, "GatedRepo",
                    f"Access to model {repo} is restricted and you are not in the "
                    "authorized list.",
                )
        item = self.files.get((repo, path))
        commits = {f.commit for f in self.files.values() if f.repo == repo}
        if revision != "main" and revision not in commits:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        if item is None or (revision != "main" and revision != item.commit):
            return self._error(404, "EntryNotFound", f"{path} does not exist")
        base = self.public_cdn_url or self.cdn_url
        body = f"Found. Redirecting to {base}/cdn/{item.sha256}"
        return web.Response(
            status=302, text=body, content_type="text/plain",
            headers={
                "Location": f"{base}/cdn/{item.sha256}?expires=1&sig={secrets.token_hex(8)}",
                "X-Repo-Commit": item.commit,
                "X-Linked-Etag": f'"{item.sha256}"',
                "X-Linked-Size": str(item.size),
                "ETag": f'"{item.blob_id}"',
                "Accept-Ranges": "bytes",
            },
        )

    async def _cdn(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        item = next((f for f in self.files.values() if f.sha256 == request.match_info["sha256"]),
                    None)
        if item is None:
            return web.Response(status=404, text="NoSuchKey")
        if self.down:
            return web.Response(status=503, text="Service Unavailable")
        start, status = 0, 200
        headers = {"ETag": f'"{item.sha256}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        match = _RANGE.match(request.headers.get("Range", ""))
        if match:
            start = int(match.group(1))
            if start >= item.size:
                return web.Response(status=416, headers={"Content-Range": f"bytes */{item.size}"})
            status = 206
            headers["Content-Range"] = f"bytes {start}-{item.size - 1}/{item.size}"
        if not self.oversize:
            headers["Content-Length"] = str(item.size - start)
        response = web.StreamResponse(status=status, headers=headers)
        await response.prepare(request)
        if request.method == "HEAD":
            return response
        limit = None
        if self.cut_after is not None and self.cuts > 0:
            self.cuts -= 1
            limit = self.cut_after
        sent = 0
        for offset, chunk in _chunks(item, start):
            if self.corrupt is not None and offset <= self.corrupt < offset + len(chunk):
                chunk = bytearray(chunk)
                chunk[self.corrupt - offset] ^= 0xFF
                chunk = bytes(chunk)
            if limit is not None and sent + len(chunk) > limit:
                chunk = chunk[: limit - sent]
                await response.write(chunk)
                self.sent[item.sha256] += len(chunk)
                # End the connection mid-body, as a dropped line or a reset would.
                assert request.transport is not None
                request.transport.abort()
                self.down = self.down or self.down_after_cut
                return response
            await response.write(chunk)
            sent += len(chunk)
            self.sent[item.sha256] += len(chunk)
        extra = self.oversize
        while extra > 0:
            chunk = bytes(min(CHUNK, extra))
            try:
                await response.write(chunk)
            except ConnectionError:
                return response  # the client stopped reading
            extra -= len(chunk)
            self.sent[item.sha256] += len(chunk)
        await response.write_eof()
        return response


def _chunks(item: FakeFile, start: int):  # type: ignore[no-untyped-def]
    if isinstance(item.data, bytes):
        view = memoryview(item.data)
        for offset in range(start, item.size, CHUNK):
            yield offset, bytes(view[offset:offset + CHUNK])
        return
    with open(item.data, "rb") as handle:
        handle.seek(start)
        offset = start
        while chunk := handle.read(CHUNK):
            yield offset, chunk
            offset += len(chunk)


async def _serve(files: list[tuple[str, str, str, str | None]]) -> None:
    hub = FakeHub()
    for repo, path, file, sha in files:
        hub.add(repo, path, Path(file), sha256=sha, commit="0" * 40)
    await hub.start()
    print(hub.port, flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--file", nargs=4, action="append", default=[],
                        metavar=("REPO", "PATH", "FILE", "SHA256"))
    args = parser.parse_args()
    try:
        asyncio.run(_serve([(r, p, f, s) for r, p, f, s in args.file]))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
