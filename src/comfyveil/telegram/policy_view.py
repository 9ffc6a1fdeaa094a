"""The /policy message: what the content policy refuses and hides, and how often it refused
(pure; Telegram HTML)."""

from __future__ import annotations

import html
from collections.abc import Sequence

from comfyveil import i18n, policy
from comfyveil.i18n import _, ltr, n_
from comfyveil.store import refusals

MAX_MESSAGE_CHARS = 4096
SHOWN_PER_LIST = 30  # terms or patterns listed before "… and N more"


def _esc(text: str) -> str:
    return html.escape(text, quote=False)


def _listed(label: str, items: Sequence[str]) -> str:
    if not items:
        return _("{label}: none").format(label=label)
    shown = i18n.join_list(
        ltr(f"<code>{_esc(item[:80])}</code>") for item in items[:SHOWN_PER_LIST]
    )
    text = f"{label} ({ltr(len(items))}): {shown}"
    more = len(items) - SHOWN_PER_LIST
    if more > 0:
        text += " " + n_("… and {n} more", "… and {n} more", more).format(n=ltr(more))
    return text


def _rules(rules: policy.Rules) -> list[str]:
    return [_listed(_("Terms"), rules.terms), _listed(_("Patterns"), rules.patterns)]


def policy_text(
    cfg: policy.PolicyConfig,
    *,
    workflow_spoilers: Sequence[str] = (),
    counts: Sequence[refusals.RefusalCount] = (),
) -> str:
    """Rules for all commands, per command, spoilers, and refusals counted (not prompts)."""
    lines = [_("<b>Content policy</b>"), _("<b>Every command</b>"), *_rules(cfg.common)]
    for name, rules in sorted(cfg.commands.items()):
        lines.append(
            _("<b>{command}</b> (besides the above)").format(command=ltr(f"/{_esc(name)}"))
        )
        lines.extend(_rules(rules))
    spoilers: list[str] = []
    if cfg.common.spoiler:
        spoilers.append(_("every result"))
    spoilers += [ltr(f"/{_esc(n)}") for n, r in sorted(cfg.commands.items()) if r.spoiler]
    spoilers += [
        _("{command} (its workflow)").format(command=ltr(f"/{_esc(n)}")) for n in workflow_spoilers
    ]
    spoilers += [_("chat {id}").format(id=ltr(f"<code>{c}</code>")) for c in cfg.spoiler_chats]
    lines.append(
        _("<b>Spoilers</b>: {where}; users may also choose them in /settings.").format(
            where=i18n.join_list(spoilers) if spoilers else _("none")
        )
    )
    lines.append(_("<b>Refused prompts</b> (counts only; prompts are not kept)"))
    if not counts:
        lines.append(_("None so far."))
    for count in counts:
        lines.append(
            _("{command}: {today} today · {week} in 7 days · {total} in all").format(
                command=ltr(f"/{_esc(count.command)}"),
                today=ltr(count.today),
                week=ltr(count.week),
                total=ltr(count.total),
            )
        )
    text = "\n".join(lines)
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 1]
        text = text[: text.rfind("\n")] + "\n…"
    return text
