"""`WebStore`: every table the web front end owns, in one object; the parts, one module
each, are `web_invites`, `web_logins` (accounts and sessions), `web_links` and
`web_listings`."""

from __future__ import annotations

from comfyveil.store.web_invites import WebInvites
from comfyveil.store.web_links import WebLinks
from comfyveil.store.web_listings import WebListings


class WebStore(WebInvites, WebLinks, WebListings):
    """The web front end's accounts, invitations, sessions, links and listings."""
