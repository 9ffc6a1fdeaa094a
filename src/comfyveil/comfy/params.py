"""A command option's value: coerced to its parameter's type and checked against its bounds,
with the one plain sentence a user sees when it does not fit."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from comfyveil import i18n
from comfyveil.errors import UsageError
from comfyveil.i18n import _, ltr, n_

__all__ = ["PARAM_TYPES", "SEED_MAX", "Param", "ParamError", "Target"]

PARAM_TYPES = ("text", "int", "float", "seed", "image", "choice", "bool")
SEED_MAX = 2**53 - 1  # the largest integer a JSON number keeps exactly everywhere

# C0 and C1 controls but tab, line feed and carriage return; lone surrogates.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
_TRUE = frozenset({"true", "yes", "on", "1", "y"})
_FALSE = frozenset({"false", "no", "off", "0", "n"})


class ParamError(UsageError):
    """An option of the command is not valid."""

    def __init__(self, message: str | None = None, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Target:
    """One node input that a parameter sets."""

    node: str
    input: str


@dataclass(frozen=True)
class Param:
    """A command option bound to one or more node inputs of the graph."""

    name: str
    type: str
    targets: tuple[Target, ...]
    required: bool = False
    default: Any = None
    min: int | float | None = None
    max: int | float | None = None
    max_length: int | None = None
    choices: tuple[Any, ...] | None = None
    description: str = ""
    step: int | float | None = None
    aliases: tuple[str, ...] = ()
    free_text: bool = False
    # What a form calls the option ("" = its name), and translations of it and of the
    # description by language code (``label.fa = "..."``), as (code, text) pairs.
    label: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    descriptions: tuple[tuple[str, str], ...] = ()

    def label_in(self, language: str | None) -> str:
        """The label in `language`, else the default label ("" when none was given)."""
        return translated(dict(self.labels), language) or self.label

    def description_in(self, language: str | None) -> str:
        return translated(dict(self.descriptions), language) or self.description

    def described(self) -> str:
        """The description in the current language: the TOML's own translation, else the
        catalog's (the shipped workflows' texts are in it; an operator's stay as written)."""
        own = translated(dict(self.descriptions), i18n.current())
        if own:
            return own
        return _(self.description) if self.description else ""

    def convert(self, value: object) -> object:
        """Return `value` coerced to this parameter's type and checked against its bounds.

        Raises:
            ParamError: one plain sentence naming the parameter and the problem.
        """
        if self.type == "text":
            return self._convert_text(value)
        if self.type in ("int", "seed"):
            return self._check_range(self._to_int(value))
        if self.type == "float":
            return self._check_range(self._to_float(value))
        if self.type == "bool":
            return self._to_bool(value)
        if self.type == "choice":
            return self._to_choice(value)
        return self._to_image(value)

    def to_dict(self) -> dict[str, Any]:
        """The binding as plain data (for hashing and storage)."""
        return {
            "name": self.name,
            "type": self.type,
            "targets": [[t.node, t.input] for t in self.targets],
            "required": self.required,
            "default": self.default,
            "min": self.min,
            "max": self.max,
            "step": self.step,
            "max_length": self.max_length,
            "choices": list(self.choices) if self.choices is not None else None,
            "description": self.description,
            "aliases": list(self.aliases),
            "free_text": self.free_text,
            # Only when set, so workflows without them keep the hash they always had.
            **({"label": self.label} if self.label else {}),
            **({"labels": dict(self.labels)} if self.labels else {}),
            **({"descriptions": dict(self.descriptions)} if self.descriptions else {}),
        }

    def _fail(self, message: str) -> ParamError:
        return ParamError(message, param=self.name)

    @property
    def _shown(self) -> str:
        # The option as users type it; kept left to right inside a right-to-left sentence.
        return ltr(self.name)

    def _convert_text(self, value: object) -> str:
        if not isinstance(value, str):
            raise self._fail(_("{name} must be text").format(name=self._shown))
        if self.max_length is not None and len(value) > self.max_length:
            raise self._fail(n_(
                "{name} is too long ({length} character, at most {limit})",
                "{name} is too long ({length} characters, at most {limit})",
                len(value),
            ).format(name=self._shown, length=ltr(len(value)), limit=ltr(self.max_length)))
        if self.required and not value.strip():
            raise self._fail(_("{name} must not be empty").format(name=self._shown))
        if _CONTROL.search(value):
            # NUL and lone surrogates make PostgreSQL refuse the row and quote it in its
            # error; the rest draw nothing (issue 22 §8). Lines and tabs are text.
            raise self._fail(
                _("{name} must not hold control characters").format(name=self._shown)
            )
        return value

    def _to_int(self, value: object) -> int:
        if isinstance(value, bool):
            raise self._fail(_("{name} must be a whole number").format(name=self._shown))
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise self._fail(_("{name} must be a whole number (got {value})").format(
            name=self._shown, value=ltr(show(value))))

    def _to_float(self, value: object) -> float:
        number: float | None = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                number = None
        if number is None or not math.isfinite(number):
            raise self._fail(_("{name} must be a number (got {value})").format(
                name=self._shown, value=ltr(show(value))))
        return number

    def _check_range(self, number: int | float) -> int | float:
        low = self.min if self.min is not None else (0 if self.type == "seed" else None)
        high = self.max if self.max is not None else (SEED_MAX if self.type == "seed" else None)
        if (low is not None and number < low) or (high is not None and number > high):
            if low is not None and high is not None:
                text = _("{name} must be between {low} and {high} (got {value})")
            elif low is not None:
                text = _("{name} must be at least {low} (got {value})")
            else:
                text = _("{name} must be at most {high} (got {value})")
            raise self._fail(text.format(
                name=self._shown, low=ltr(num(low) if low is not None else ""),
                high=ltr(num(high) if high is not None else ""), value=ltr(num(number))))
        if self.step:
            base = low or 0
            ratio = (number - base) / self.step
            if abs(ratio - round(ratio)) > 1e-9:
                if base % self.step == 0:
                    text = _("{name} must be a multiple of {step} (got {value})")
                else:
                    text = _("{name} must be {base} plus a multiple of {step} (got {value})")
                raise self._fail(text.format(
                    name=self._shown, base=ltr(num(base)), step=ltr(num(self.step)),
                    value=ltr(num(number))))
        return number

    def _to_bool(self, value: object) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            word = value.strip().lower()
            if word in _TRUE:
                return True
            if word in _FALSE:
                return False
        raise self._fail(_("{name} must be yes or no (got {value})").format(
            name=self._shown, value=ltr(show(value))))

    def _to_choice(self, value: object) -> object:
        for choice in self.choices or ():
            if value == choice or (isinstance(value, str) and value.strip() == str(choice)):
                return choice
        options = ", ".join(str(c) for c in self.choices or ())
        raise self._fail(_("{name} must be one of: {options} (got {value})").format(
            name=self._shown, options=ltr(options), value=ltr(show(value))))

    def _to_image(self, value: object) -> object:
        if isinstance(value, os.PathLike) or (isinstance(value, str) and value.strip()):
            return value
        raise self._fail(_("{name} must be an image").format(name=self._shown))


# --- words for messages ---------------------------------------------------------


def num(value: float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def show(value: object) -> str:
    return repr(clip(value, 30)) if isinstance(value, str) else clip(repr(value), 30)


def translated(texts: Mapping[str, str], language: str | None) -> str | None:
    """The text of `texts` (by language code) for `language`: "pt-br" falls back to "pt",
    and "zh" finds "zh-hans"; None when there is none."""
    if not language or not texts:
        return None
    code = language.lower().replace("_", "-")
    base = code.split("-")[0]
    if found := texts.get(code) or texts.get(base):
        return found
    return next((text for key, text in texts.items() if key.split("-")[0] == base), None)
