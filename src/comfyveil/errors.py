"""The root of comfyveil's exception tree.

    ComfyveilError
     ├── ConfigError                 (comfyveil.config)
     ├── UsageError                  bad input from a user: a CLI argument, a chat option
     ├── comfy.errors.ComfyError     talking to a ComfyUI backend
     ├── workflow errors             (comfyveil.comfy.workflow)
     ├── store.errors.StoreError     PostgreSQL
     └── anyone.errors.AnonError     the anon process and its control port

Every class's docstring is its default message, so each one reads as a sentence.
`str(error)` is always fit to show a chat user or print on one line: no traceback,
no prompt text, no secrets.
"""

from __future__ import annotations


class ComfyveilError(Exception):
    """Something went wrong in comfyveil."""

    def __init__(self, message: str | None = None) -> None:
        self.message = message or (self.__doc__ or "").strip().splitlines()[0]
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


class UsageError(ComfyveilError):
    """The request is not valid."""


class ConfigError(ComfyveilError):
    """The configuration is not valid."""


def sentence(text: str) -> str:
    """An error's words as one sentence, as the web pages and the API show them: a capital
    first letter and a full stop at the end (unless it ends with one, ! or ?)."""
    text = text.strip()
    if not text:
        return text
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."
