"""The compile cache: RL samples repeat, so a program compiled once is not compiled again.

Keyed by language, toolchain identity, compile command and the hashes of the source and
the files given with it; holds the compile step's result and the files it produced, least
recently used first out beyond ``max_bytes``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

__all__ = ["CompileCache"]


class CompileCache:
    """A bounded LRU map of compile outcomes (thread-safe)."""

    def __init__(self, *, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[dict[str, Any], dict[str, bytes], int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> tuple[dict[str, Any], dict[str, bytes]] | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0], item[1]

    def put(self, key: str, result: Mapping[str, Any], artifacts: Mapping[str, bytes]) -> None:
        size = sum(len(v) + len(k) for k, v in artifacts.items()) + 256
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[2]
            self._items[key] = (dict(result), dict(artifacts), size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, _, n) = self._items.popitem(last=False)
                self._bytes -= n

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "compile_cache_entries": len(self._items),
                "compile_cache_bytes": self._bytes,
            }
