"""Short-lived signed links to a result (``response_format=url``): the link is the
permission, as a client fetches it without the key; it names one output and expires."""

from __future__ import annotations

import hashlib
import hmac
import re
import time
import uuid

from comfyveil import constant_time

LINK_SECONDS = 600  # long enough for a client to fetch it, short enough to be harmless
# What `path` writes, and nothing else: "²" passes str.isdigit but not int, and
# hmac.compare_digest raises on a non-ASCII string.
EXPIRES = re.compile(r"[0-9]{1,12}")
SIG = re.compile(r"[0-9a-f]{1,128}")


def signature(secret: bytes, job_id: uuid.UUID, index: int, expires: int, fmt: str = "") -> str:
    # the output format is signed too, when one was asked (a link names one file)
    message = (f"{job_id}:{index}:{expires}" + (f":{fmt}" if fmt else "")).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def path(
    secret: bytes, job_id: uuid.UUID, index: int, *, now: float | None = None, fmt: str = ""
) -> str:
    expires = int(now if now is not None else time.time()) + LINK_SECONDS
    sig = signature(secret, job_id, index, expires, fmt)
    shown = f"&format={fmt}" if fmt else ""
    return f"/v1/files/{job_id}/{index}?expires={expires}&sig={sig}{shown}"


def well_formed(expires: str, sig: str) -> bool:
    """Whether the query is one `path` could have written (else the link is a 404)."""
    return EXPIRES.fullmatch(expires) is not None and SIG.fullmatch(sig) is not None


def valid(
    secret: bytes, job_id: uuid.UUID, index: int, expires: str, sig: str, *, fmt: str = ""
) -> bool:
    if not well_formed(expires, sig) or int(expires) < time.time():
        return False
    return constant_time.same(sig, signature(secret, job_id, index, int(expires), fmt))
