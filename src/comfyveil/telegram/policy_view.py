"""The /policy message: what the content policy refuses and hides, and how often it refused
(pure; Telegram HTML)."""

from __future__ import annotations

import html
from collections.abc import Sequence

from comfyveil import policy
from comfyveil.store import refusals

MAX_MESSAGE_CHARS = 4096
SHOWN_PER_LIST = 30  # terms or patterns listed before "… and N more"


def _esc(text: str) -> str:
    return html.escape(text, quote=False)


def _listed(label: str, items: Sequence[str]) -> str:
    if not items:
        return f"{label}: none"
    shown = ", ".join(f"<code>{_esc(item[:80])}</code>" for item in items[:SHOWN_PER_LIST])
    more = len(items) - SHOWN_PER_LIST
    return f"{label} ({len(items)}): {shown}" + (f" … and {more} more" if more > 0 else "")


def _rules(rules: policy.Rules) -> list[str]:
    return [_listed("Terms", rules.terms), _listed("Patterns", rules.patterns)]


def policy_text(
    cfg: policy.PolicyConfig,
    *,
    workflow_spoilers: Sequence[str] = (),
    counts: Sequence[refusals.RefusalCount] = (),
) -> str:
    """Rules for all commands, per command, spoilers, and refusals counted (not prompts)."""
    lines = ["<b>Content policy</b>", "<b>Every command</b>", *_rules(cfg.common)]
    for name, rules in sorted(cfg.commands.items()):
        lines.append(f"<b>/{_esc(name)}</b> (besides the above)")
        lines.extend(_rules(rules))
    spoilers: list[str] = []
    if cfg.common.spoiler:
        spoilers.append("every result")
    spoilers += [f"/{_esc(n)}" for n, r in sorted(cfg.commands.items()) if r.spoiler]
    spoilers += [f"/{_esc(n)} (its workflow)" for n in workflow_spoilers]
    spoilers += [f"chat <code>{c}</code>" for c in cfg.spoiler_chats]
    lines.append(
        "<b>Spoilers</b>: "
        + (", ".join(spoilers) if spoilers else "none")
        + "; users may also choose them in /settings."
    )
    lines.append("<b>Refused prompts</b> (counts only; prompts are not kept)")
    if not counts:
        lines.append("None so far.")
    for count in counts:
        lines.append(
            f"/{_esc(count.command)}: {count.today} today · {count.week} in 7 days"
            f" · {count.total} in all"
        )
    text = "\n".join(lines)
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 1]
        text = text[: text.rfind("\n")] + "\n…"
    return text
