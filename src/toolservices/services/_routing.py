"""Which replica of a service gets a call.

Calls with a session id use rendezvous (highest-random-weight) hashing over
the replica *names*: every worker computes the same ranking without talking
to anyone, so a session reaches the same replica from every process. When a
replica is known to be dead it is skipped and only *its* sessions move (to
their second-ranked replica); every other session stays where it is. A
shared routing table would instead need a round trip per new session and a
process of its own that can fail.

Calls without a session go to the replica with the fewest calls in flight
from this client, ties broken round-robin.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import Hashable, Sequence

__all__ = ["ReplicaRouter", "rendezvous_rank"]


def _weight(session_id: Hashable, replica: str) -> int:
    key = f"{session_id!s}\x00{replica}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


def rendezvous_rank(session_id: Hashable, replicas: Sequence[str]) -> list[int]:
    """Replica indices ordered from preferred to last resort for ``session_id``."""
    return sorted(
        range(len(replicas)), key=lambda i: _weight(session_id, replicas[i]), reverse=True
    )


class ReplicaRouter:
    """Picks a replica index and counts calls in flight (thread-safe)."""

    def __init__(self, replicas: Sequence[str]) -> None:
        self.replicas = tuple(replicas)
        self._in_flight = [0] * len(self.replicas)
        self._dead: set[int] = set()
        self._tie = itertools.count()
        self._lock = threading.Lock()

    def live(self) -> list[int]:
        return [i for i in range(len(self.replicas)) if i not in self._dead]

    def for_session(self, session_id: Hashable) -> int | None:
        """The live replica holding ``session_id``; None when every replica is dead."""
        for i in rendezvous_rank(session_id, self.replicas):
            if i not in self._dead:
                return i
        return None

    def least_loaded(self) -> int | None:
        with self._lock:
            live = self.live()
            if not live:
                return None
            low = min(self._in_flight[i] for i in live)
            candidates = [i for i in live if self._in_flight[i] == low]
            return candidates[next(self._tie) % len(candidates)]

    def pick(self, session_id: Hashable | None) -> int | None:
        if len(self.replicas) == 1:
            return None if 0 in self._dead else 0
        if session_id is not None:
            return self.for_session(session_id)
        return self.least_loaded()

    def started(self, index: int) -> None:
        with self._lock:
            self._in_flight[index] += 1

    def finished(self, index: int) -> None:
        with self._lock:
            self._in_flight[index] -= 1

    def mark_dead(self, index: int) -> None:
        with self._lock:
            self._dead.add(index)

    def revive_all(self) -> None:
        with self._lock:
            self._dead.clear()

    def in_flight(self) -> list[int]:
        with self._lock:
            return list(self._in_flight)
