"""Right-to-left pages keep `/f` reading `/f`: every page a signed-in admin can reach by
following links, in Persian and Arabic, found by walking the site (not by listing
templates, which misses the spots a new page adds)."""

from __future__ import annotations

import html.parser
import re
import urllib.parse
import uuid

from tests.web.support import client, csrf_of, get_text, sign_up, web_stack
from tests.web.test_web_jobs import JOB_URL, finished, submit_form

# A chat command in running text: a slash, then a name, not part of a path or an address.
COMMAND = re.compile(r"(?<![\w/.:~-])/[a-z][a-z0-9_]*(?![\w/.])")
OPENS, CLOSE = "\u2066\u2067\u2068", "\u2069"  # LRI RLI FSI ... PDI
ISOLATING = {"bdi"}  # besides any element with dir="ltr" or dir="auto"
SHOWN_ATTRIBUTES = ("alt", "title", "aria-label", "placeholder")
SKIP = re.compile(r"/out/|/thumb/|/in/|download=|/logout|\.(css|js|png|ico)$")
MAX_PAGES = 80
JOBS_WALKED = 3  # job pages of each kind are alike: a few of them show every spot


def _isolated(text: str, at: int) -> bool:
    depth = 0
    for char in text[:at]:
        if char in OPENS:
            depth += 1
        elif char == CLOSE and depth:
            depth -= 1
    return depth > 0


class _Page(html.parser.HTMLParser):
    """Links, and each command shown without an isolate around it."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.bare: list[str] = []
        self._open: list[tuple[str, bool]] = []  # (tag, isolates its content)

    def _inside_isolate(self) -> bool:
        return any(isolates for _, isolates in self._open)

    def _check(self, text: str, where: str) -> None:
        for found in COMMAND.finditer(text):
            if not _isolated(text, found.start()):
                self.bare.append(f"{where}: {text.strip()[:80]!r}")

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "a" and named.get("href"):
            self.links.append(str(named["href"]))
        for name in SHOWN_ATTRIBUTES:
            if named.get(name):
                self._check(str(named[name]), f"<{tag} {name}>")
        if tag == "input" and named.get("type") in ("submit", "button") and named.get("value"):
            self._check(str(named["value"]), f"<{tag} value>")
        if tag not in ("br", "img", "input", "meta", "link", "hr", "source"):
            isolates = tag in ISOLATING or named.get("dir") in ("ltr", "auto")
            self._open.append((tag, isolates))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i][0] == tag:
                del self._open[i:]
                break

    def handle_data(self, data: str) -> None:
        if self._inside_isolate() or any(tag in ("script", "style") for tag, _ in self._open):
            return
        where = "/".join(tag for tag, _ in self._open[-3:])
        self._check(data, where)


def _kind(path: str) -> str:
    """Pages alike for this check share a kind (every job page is one kind)."""
    return re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}", "ID", path.split("?")[0])


async def test_every_page_keeps_commands_left_to_right_in_persian_and_arabic(
    db, fake_comfy
) -> None:
    async with web_stack(db, [fake_comfy]) as stack, client() as session:
        await sign_up(session, await stack.invite(admin=True), "nour")
        made = await submit_form(
            session, stack.url, "f", {"prompt": "a fox", "width": "256", "height": "256"}
        )
        job_id = uuid.UUID(JOB_URL.search(str(made.url)).group(1))  # type: ignore[union-attr]
        await finished(stack, job_id)
        # An edit of that result (the "edit this" links, the result choices), and a failure.
        await submit_form(session, stack.url, "qwen",
                          {"prompt": "make it night", "image__from": f"{job_id}:0"})
        fake_comfy.fail_next_execution("KSampler", message="CUDA out of memory")
        failed = await submit_form(
            session, stack.url, "f", {"prompt": "a cat", "width": "256", "height": "256"}
        )
        await finished(stack, uuid.UUID(JOB_URL.search(str(failed.url)).group(1)))  # type: ignore[union-attr]

        for language in ("fa", "ar"):
            _, page = await get_text(session, stack.url + "/settings")
            async with session.post(
                stack.url + "/settings",
                data={"csrf": csrf_of(page), "steps": "", "seed": "", "language": language},
            ) as response:
                assert response.status == 200
            queue, seen, kinds = ["/"], set(), {}
            bare: dict[str, list[str]] = {}
            while queue and len(seen) < MAX_PAGES:
                path = queue.pop(0)
                if path in seen:
                    continue
                seen.add(path)
                kind = _kind(path)
                kinds[kind] = kinds.get(kind, 0) + 1
                if kinds[kind] > JOBS_WALKED:
                    continue
                status, text = await get_text(session, stack.url + path)
                assert status == 200, (language, path)
                assert f'<html lang="{language}" dir="rtl"' in text, (language, path)
                parsed = _Page()
                parsed.feed(text)
                if parsed.bare:
                    bare[path] = parsed.bare
                for link in parsed.links:
                    target = urllib.parse.urljoin(stack.url + path, link)
                    if not target.startswith(stack.url) or SKIP.search(target):
                        continue
                    queue.append(target.removeprefix(stack.url) or "/")
            # The walk reached every part of the site, so "nothing bare" means something.
            for expected in ("/", "/history", "/gallery", "/settings", "/c/f", "/c/qwen",
                             "/jobs/ID", "/admin", "/admin/users", "/admin/workflows",
                             "/admin/backends", "/admin/invites"):
                assert expected in kinds, (language, expected, sorted(kinds))
            assert not bare, f"{language}:\n" + "\n".join(
                f"{path}: {spot}" for path, spots in bare.items() for spot in spots)
