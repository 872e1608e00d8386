"""Small services for the registry tests; shipped to Ray workers by value."""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any

#: What the package's first Ray registry passes to ray.init (Ray is not running yet).
RAY_INIT_CONFIG: dict[str, Any] = {
    "num_cpus": 2,
    "include_dashboard": False,
    "log_to_driver": False,
    "object_store_memory": 80 * 1024 * 1024,
}
RAY_INIT_CONFIG_COPY = dict(RAY_INIT_CONFIG)


def new_namespace() -> str:
    """A fresh namespace, so that tests never see each other's services."""
    return f"t-{uuid.uuid4().hex[:10]}"


class Counter:
    """State that shows whether two calls reached the same object."""

    def __init__(self, start: int = 0, *, marker: str | None = None) -> None:
        self.value = start
        self.ident = uuid.uuid4().hex
        self.marker = marker

    def incr(self, k: int = 1) -> int:
        self.value += k
        return self.value

    def whoami(self, session_id: str | None = None) -> str:
        return self.ident

    def pid(self) -> int:
        return os.getpid()

    def fail(self) -> None:
        raise ValueError("Test error")

    def block(self, seconds: float) -> str:
        threading.Event().wait(seconds)  # stands for a long computation
        return self.ident


class Sessions:
    """Keeps per-session state, like the Python executor does."""

    def __init__(self) -> None:
        self.ident = uuid.uuid4().hex
        self.state: dict[str, list[Any]] = {}
        self.twin_calls = 0

    def remember(self, value: Any, *, session_id: str) -> dict[str, Any]:
        self.state.setdefault(session_id, []).append(value)
        return {"replica": self.ident, "seen": list(self.state[session_id])}

    async def aremember(self, value: Any, *, session_id: str) -> dict[str, Any]:
        self.twin_calls += 1
        return self.remember(value, session_id=session_id)

    def whoami(self, session_id: str | None = None) -> str:
        return self.ident

    def pid(self) -> int:
        return os.getpid()

    async def ahold(self, seconds: float) -> str:
        import asyncio

        await asyncio.sleep(seconds)  # keeps the call in flight while others are routed
        return self.ident

    def hold(self, seconds: float) -> str:
        time.sleep(seconds)
        return self.ident

    def twins(self) -> int:
        return self.twin_calls


class Closing:
    """Writes a line to ``path`` when closed, so a test sees close() ran (also on Ray)."""

    def __init__(self, path: str, *, fail: bool = False) -> None:
        self.path = path
        self.fail = fail

    def ping(self) -> str:
        return "pong"

    def close(self) -> None:
        with open(self.path, "a") as fh:
            fh.write("closed\n")
        if self.fail:
            raise RuntimeError("close failed on purpose")


class WithMemoryParam:
    """A constructor parameter that is also a Ray actor option name."""

    def __init__(self, memory: int = 0) -> None:
        self.memory = memory

    def get_memory(self) -> int:
        return self.memory

    def resources(self) -> dict[str, float]:
        import ray

        return dict(ray.get_runtime_context().get_assigned_resources())


class BrokenInit:
    def __init__(self) -> None:
        raise RuntimeError("constructor failed")

    def ping(self) -> str:
        return "unreachable"


class TakesReplicas:
    """A constructor parameter named like the registry's own option."""

    def __init__(self, num_replicas: int = 0) -> None:
        self.num_replicas = num_replicas

    def get(self) -> int:
        return self.num_replicas


class OwnerClient:
    """The capability a Service owner hands out: reads only, no lifecycle methods."""

    def __init__(self, owner_id: str, value: int) -> None:
        self.owner_id = owner_id
        self.value = value


class Owner:
    """A Service owner (TorchRL 0.14's protocol): start, shutdown, client, is_alive."""

    def __init__(self, value: int = 0) -> None:
        self.ident = uuid.uuid4().hex
        self.value = value
        self.alive = False
        self.shutdowns = 0

    def start(self) -> Owner:
        self.alive = True
        return self

    def shutdown(self, timeout: float | None = None) -> None:
        self.alive = False
        self.shutdowns += 1

    def client(self) -> OwnerClient:
        return OwnerClient(self.ident, self.value)

    @property
    def is_alive(self) -> bool:
        return self.alive


class Tokenizer:
    """TorchRL's own registry example registers a tokenizer class like this one."""

    def __init__(self, vocab_size: int = 1000) -> None:
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [ord(c) % self.vocab_size for c in text]


def wait_running(registry: Any, name: str) -> None:
    """Return once every replica of ``name`` has run its constructor.

    On Ray ``reset()`` closes only actors that got a worker: one still waiting
    for its process after a short grace is killed without close() (it ran no
    constructor), so a test about close() first waits for its services.
    """
    if registry.backend == "ray":
        import ray

        ray.get([h.__ray_ready__.remote() for h in registry.replicas(name)], timeout=60)
