"""Which descriptor uploads of each hidden service anon has finished, and which are still
on their way, read from its HS_DESC events (tor's control-spec, as anon formats them):

    HS_DESC UPLOAD   <address> UNKNOWN <directory> <descriptor id> [HSDIR_INDEX=...]
    HS_DESC UPLOADED <address> UNKNOWN <directory>
    HS_DESC FAILED   <address> UNKNOWN <directory> [REASON=...]

(FAILED also ends a fetch of the descriptor this anon made as a client; it then ends an
upload to that directory only if one was on its way, a harmless early end.)

A publication sends one UPLOAD per directory, then UPLOADED or FAILED for each. Before it
publishes a descriptor again (a client revoked, new introduction points), anon closes that
descriptor's uploads still on their way, and says nothing of them (tor's
`close_directory_connections`). Counted one by one, each of those stayed "on its way" for
ever, and a wait for the publication to reach every directory ran out (once in about ten
runs of the suite, after revoking a client). So an upload is known by its descriptor and
directory: a new UPLOAD to the same directory takes the place of the one closed, and a new
round of a descriptor (its first UPLOAD after ROUND_GAP) forgets that descriptor's
earlier uploads, wherever they went; a round older than STALE_AFTER is not waited for.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from comfyveil.anyone import hidden

# Seconds between two UPLOADs of one descriptor that start a new round: anon sends a
# round's UPLOADs together, one per directory, in one pass over them.
ROUND_GAP = 5.0
# Seconds after which a round's uploads no answer ended are no longer waited for: a
# descriptor of a time period gone is never published again to replace them, and a
# directory request that still lives has long been answered or timed out by then.
STALE_AFTER = 300.0


class DescriptorUploads:
    """Descriptor uploads per hidden service (its address without the suffix)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._uploaded: dict[str, int] = {}
        # service -> descriptor id -> directories its upload has not ended at yet
        self._on_the_way: dict[str, dict[str, set[str]]] = {}
        self._round_at: dict[tuple[str, str], float] = {}

    def uploaded(self, service_id: str) -> int:
        """How many uploads of the service's descriptors a directory accepted."""
        return self._uploaded.get(service_id, 0)

    def on_the_way(self, service_id: str) -> int:
        """Uploads started and not ended (neither accepted nor failed nor replaced), of
        rounds begun within STALE_AFTER."""
        now = self._clock()
        return sum(
            len(directories)
            for descriptor, directories in self._on_the_way.get(service_id, {}).items()
            if now - self._round_at.get((service_id, descriptor), now) <= STALE_AFTER
        )

    def feed(self, text: str) -> bool:
        """Take one event's text ("HS_DESC ..."); True when it concerned an upload."""
        parts = text.split()
        if len(parts) < 5 or parts[0] != "HS_DESC":
            return False
        action, service_id, directory = parts[1], _service_id(parts[2]), parts[4]
        if action == "UPLOAD":
            descriptor = parts[5] if len(parts) > 5 else ""
            now = self._clock()
            started = self._round_at.get((service_id, descriptor))
            descriptors = self._on_the_way.setdefault(service_id, {})
            if started is None or now - started > ROUND_GAP:
                descriptors[descriptor] = set()  # anon closed the round before, unsaid
            self._round_at[(service_id, descriptor)] = now
            descriptors.setdefault(descriptor, set()).add(directory)
            return True
        if action not in ("UPLOADED", "FAILED"):
            return False
        for directories in self._on_the_way.get(service_id, {}).values():
            if directory in directories:
                directories.discard(directory)
                break
        if action == "UPLOADED":
            self._uploaded[service_id] = self.uploaded(service_id) + 1
        return True


def _service_id(address: str) -> str:
    service_id = address.lower()
    for suffix in hidden.KNOWN_SUFFIXES:
        service_id = service_id.removesuffix(suffix)
    return service_id
