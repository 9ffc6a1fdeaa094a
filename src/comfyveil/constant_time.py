"""Comparing a secret with what a stranger sent, in constant time, whatever was sent.

`hmac.compare_digest` on two `str` raises TypeError when either holds a non-ASCII
character: a token, cookie or code typed or forged with one then reached the error
handler as a crash (a 500 and an ERROR line per request) instead of a refusal.
"""

from __future__ import annotations

import hmac


def same(sent: str, secret: str) -> bool:
    """Whether `sent` is `secret`; False for anything else, never an exception."""
    return hmac.compare_digest(
        sent.encode("utf-8", "surrogatepass"), secret.encode("utf-8", "surrogatepass")
    )
