"""Call state whose writes persist: the ``_state`` an episode gives its tools.

A plain mapping passed as a call's state is copied for each call, so what a
tool writes into ``_state`` is its own. An :class:`EpisodeState` instead
copies a dict its owner keeps (an episode's ``state``) into each call's
``_state``, with the standard entries over it, and after the call writes
the tool's changes to the owner's keys back: later calls, in this turn or a
later one, see them. Standard entries are recomputed for every call, so a
tool cannot change them for the next one. Values are not copied (a mutable
value changed in place is changed in the owner's dict too).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["EpisodeState"]


class EpisodeState(Mapping[str, Any]):
    """``target`` (kept by the caller) with ``standard`` entries over it.

    Reads as the merged mapping. The dispatcher gives each call
    :meth:`for_call` and hands the tool's dict to :meth:`keep` once the call
    has returned or raised (not after a timeout: an abandoned thread may
    still be writing). Calls sharing one ``EpisodeState`` must run one at a
    time (the calls of one response do).
    """

    __slots__ = ("standard", "target")

    def __init__(self, target: dict[str, Any], standard: Mapping[str, Any]) -> None:
        self.target = target
        self.standard = standard

    def __getitem__(self, key: str) -> Any:
        if key in self.standard:
            return self.standard[key]
        return self.target[key]

    def __iter__(self) -> Iterator[str]:
        yield from self.standard
        yield from (key for key in self.target if key not in self.standard)

    def __len__(self) -> int:
        return len(self.standard) + sum(1 for key in self.target if key not in self.standard)

    def for_call(self, extra: Mapping[str, Any] | None) -> dict[str, Any]:
        """A fresh dict for one call: ``target``, then ``standard``, then ``extra``."""
        given = {**self.target, **self.standard}
        if extra:
            given.update(extra)
        return given

    def keep(self, given: Mapping[str, Any], extra: Mapping[str, Any] | None) -> None:
        """Write the call's changes to ``target``'s keys back (new, changed, deleted)."""
        snapshot = dict(given)  # one C-level copy: the tool is done with it
        reserved = self.standard.keys() | (extra.keys() if extra else set())
        target = self.target
        for key in [k for k in target if k not in snapshot and k not in reserved]:
            del target[key]
        for key, value in snapshot.items():
            if key not in reserved and (key not in target or target[key] is not value):
                target[key] = value
