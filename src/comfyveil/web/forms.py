"""One HTML form per command, generated from its workflow's parameters, and reading it back.

Each parameter becomes a labelled field: text as a text box (the prompt a text area),
numbers with their bounds and step, a choice as a select, a bool as a checkbox, an image
as a file upload or "one of my results". Reading the form checks every field on its own,
so each error is shown beside its field; nothing is queued while any remains.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from comfyveil import i18n
from comfyveil.comfy import workflow
from comfyveil.desk import registry
from comfyveil.errors import sentence
from comfyveil.i18n import N_, _

TEXTAREA_PARAMS = ("prompt", "negative")
FROM_SUFFIX = "__from"  # the "one of my results" select beside an image upload


@dataclass
class Field:
    name: str
    label: str
    kind: str  # textarea | text | number | checkbox | select | image
    value: str = ""
    help: str = ""
    required: bool = False
    min: str | None = None
    max: str | None = None
    step: str | None = None
    maxlength: int | None = None
    placeholder: str = ""
    choices: list[tuple[str, str]] = field(default_factory=list)  # (value, label)
    checked: bool = False
    error: str | None = None

    @property
    def field_id(self) -> str:
        return f"f-{self.name}"


def _num(value: float | int) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


# The shipped workflows' option names as field labels; an operator's own option is
# labelled by its name.
LABELS = {
    "prompt": N_("Prompt"),
    "negative": N_("Negative prompt"),
    "steps": N_("Steps"),
    "seed": N_("Seed"),
    "width": N_("Width"),
    "height": N_("Height"),
    "cfg": N_("CFG scale"),
    "guidance": N_("Guidance"),
    "megapixels": N_("Megapixels"),
    "length": N_("Length (frames)"),
    "fps": N_("Frames per second"),
    "image": N_("Image"),
}


def label_for(p: workflow.Param) -> str:
    """The option's label: the TOML's own (``label``, ``label.fa``), else ours for a
    shipped option name, else the name."""
    own = p.label_in(i18n.current())
    if own:
        return own
    if p.name in LABELS:
        return _(LABELS[p.name])
    return p.name.replace("_", " ").capitalize()


def _bounds(p: workflow.Param) -> str:
    parts = []
    if p.min is not None and p.max is not None:
        parts.append(_("{low} to {high}").format(low=_num(p.min), high=_num(p.max)))
    elif p.min is not None:
        parts.append(_("at least {n}").format(n=_num(p.min)))
    elif p.max is not None:
        parts.append(_("at most {n}").format(n=_num(p.max)))
    if p.step:
        parts.append(_("in steps of {n}").format(n=_num(p.step)))
    if p.max_length:
        parts.append(_("up to {n} characters").format(n=p.max_length))
    return i18n.join_list(parts)


def default_of(entry: registry.Entry, name: str, prefs: Mapping[str, Any]) -> object:
    """What a field shows before the user types: their setting, the workflow's default, or
    the value the graph holds."""
    p = entry.workflow.params[name]
    if name == "steps" and isinstance(prefs.get("steps"), int):
        return clamp(int(prefs["steps"]), p)
    if name == "seed" and prefs.get("seed_mode") == "fixed" and isinstance(prefs.get("seed"), int):
        return prefs["seed"]
    if p.type == "image" or name in entry.workflow.seed_params:
        return None  # a seed left empty is drawn afresh for each run, its default never used
    if p.default is not None:
        return p.default
    if p.required and p.type == "text":
        return None  # the graph's sample prompt is not the user's: a required text starts empty
    return registry.graph_value(entry.workflow, name)


def clamp(value: int, p: workflow.Param) -> int:
    if p.min is not None:
        value = max(value, int(p.min))
    if p.max is not None:
        value = min(value, int(p.max))
    if p.step:
        base = int(p.min or 0)
        value = base + (value - base) // int(p.step) * int(p.step)
    return value


def build_fields(
    entry: registry.Entry,
    prefs: Mapping[str, Any],
    given: Mapping[str, str] | None = None,
    errors: Mapping[str, str] | None = None,
    results: list[tuple[str, str]] | None = None,
    max_text: int | None = None,
) -> list[Field]:
    """The form's fields: `given` (a submitted form) over the defaults, with `errors`;
    `max_text` (``[limits] max_prompt_length``) bounds text fields as the desk does."""
    given = given or {}
    errors = errors or {}
    fields = []
    for name, p in entry.workflow.params.items():
        if p.type == "text" and max_text is not None and (
            p.max_length is None or p.max_length > max_text
        ):
            p = dataclasses.replace(p, max_length=max_text)
        f = Field(
            name=name,
            label=label_for(p),
            kind="text",
            required=p.required,
            help=p.described(),
            error=errors.get(name),
        )
        bounds = _bounds(p)
        if bounds:
            f.help = f"{f.help} ({bounds})" if f.help else bounds.capitalize()
        shown = given.get(name) if name in given else default_of(entry, name, prefs)
        if p.type == "text":
            f.kind = "textarea" if name in TEXTAREA_PARAMS or p.free_text else "text"
            f.maxlength = p.max_length
            f.value = "" if shown is None else str(shown)
            if p.required and name == entry.workflow.prompt_param:
                f.placeholder = _("a fox in snow")
        elif p.type in ("int", "float", "seed"):
            f.kind = "number"
            low = p.min if p.min is not None else (0 if p.type == "seed" else None)
            high = p.max if p.max is not None else (workflow.SEED_MAX if p.type == "seed" else None)
            f.min = _num(low) if low is not None else None
            f.max = _num(high) if high is not None else None
            f.step = _num(p.step) if p.step else ("1" if p.type != "float" else "any")
            f.value = "" if shown is None else str(shown)
            if name in entry.workflow.seed_params:
                f.placeholder = _("random")
                f.help = (
                    _("{help}; empty: a random seed").format(help=f.help)
                    if f.help
                    else _("Empty: a random seed")
                )
        elif p.type == "bool":
            f.kind = "checkbox"
            f.checked = (given.get(name) == "yes") if given else bool(shown)
        elif p.type == "choice":
            f.kind = "select"
            f.choices = [(str(c), str(c)) for c in p.choices or ()]
            f.value = "" if shown is None else str(shown)
        else:
            f.kind = "image"
            f.choices = list(results or [])
            f.value = str(given.get(name + FROM_SUFFIX, ""))
        fields.append(f)
    return fields


def read_values(
    entry: registry.Entry, form: Mapping[str, Any]
) -> tuple[dict[str, object], dict[str, str]]:
    """The submitted values of every non-image parameter, converted, and the errors by
    field. Empty fields count as not given (the default, or a random seed)."""
    values: dict[str, object] = {}
    errors: dict[str, str] = {}
    for name, p in entry.workflow.params.items():
        if p.type == "image":
            continue
        raw = form.get(name)
        if p.type == "bool":
            values[name] = raw == "yes"
            continue
        if not isinstance(raw, str) or (raw.strip() == "" and p.type != "text"):
            continue
        if p.type == "text" and not raw.strip() and not p.required:
            continue
        try:
            values[name] = p.convert(raw)
        except workflow.ParamError as exc:
            errors[name] = sentence(_(str(exc)))
    for name, p in entry.workflow.params.items():
        if p.required and p.type != "image" and name not in values and name not in errors:
            errors[name] = _("This field is required.")
    return values, errors


def given_strings(form: Mapping[str, Any]) -> dict[str, str]:
    """The text fields of a submitted form, to show them again beside their errors."""
    return {k: v for k, v in form.items() if isinstance(v, str)}
