"""Errors of the Anyone Network layer: the anon binary, its process and control port."""

from __future__ import annotations

from comfyveil.errors import ComfyveilError


class AnonError(ComfyveilError):
    """The Anyone Network client (anon) is not working."""


class AnonNotInstalled(AnonError):
    """The anon binary is not installed; run: comfyveil anon install."""


class UnsupportedPlatform(AnonError):
    """The anon npm package has no anon binary for this machine."""


class IntegrityError(AnonError):
    """A downloaded anon file does not match its pinned SHA-256 hash."""


class NetworkNotChosen(AnonError):
    """anon was not started: say which network it joins (a PrivateNetwork or PublicNetwork)."""


class PublicNetworkForbidden(AnonError):
    """anon was not started: the public Anyone network is forbidden here."""


class AnonStartError(AnonError):
    """anon did not start."""


class BootstrapTimeout(AnonError):
    """anon did not connect to the Anyone network in time."""


class ControlError(AnonError):
    """anon's control port refused a command."""


class HiddenServiceError(AnonError):
    """The hidden service could not be set up."""
