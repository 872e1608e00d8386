"""Scale-out: the HTTP server fronting :class:`CodeJudge` replicas on a Ray cluster, one
replica per node (``toolservices serve --sandbox-fusion --ray ADDRESS``).

The replicas are a replicated service of the registry (``services.md``): calls go to
the replica with the fewest calls in flight from this server, each replica judges with
the sandboxes and toolchains of its own node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from toolservices.judge._judge import CodeJudge
from toolservices.services import ServiceRegistry, get_services

__all__ = ["RemoteJudge", "ray_judge"]

#: the service's name in its namespace
SERVICE = "code-judge"


class RemoteJudge:
    """The judge's async API, each call sent to one of the service's replicas."""

    def __init__(self, services: ServiceRegistry, name: str, *, concurrency: int) -> None:
        self._services = services
        self._name = name
        self._client = services.client(name)
        self.replicas = len(services.replicas(name))
        #: what the server admits at once: every replica's own concurrency
        self.concurrency = concurrency * self.replicas

    async def arun_code(self, code: str, language: str, **kwargs: Any) -> dict[str, Any]:
        """:meth:`CodeJudge.arun_code` on a replica."""
        result: dict[str, Any] = await self._client.acall("arun_code", code, language, **kwargs)
        return result

    async def arun_jupyter(self, cells: Sequence[str], **kwargs: Any) -> dict[str, Any]:
        """:meth:`CodeJudge.arun_jupyter` on a replica."""
        result: dict[str, Any] = await self._client.acall("arun_jupyter", list(cells), **kwargs)
        return result

    async def arun_tests(
        self, code: str, language: str, cases: Sequence[Any], **kwargs: Any
    ) -> dict[str, Any]:
        """:meth:`CodeJudge.arun_tests` on a replica."""
        result: dict[str, Any] = await self._client.acall(
            "arun_tests", code, language, list(cases), **kwargs
        )
        return result

    async def astats(self) -> dict[str, Any]:
        """The replicas' numeric counters summed, plus ``replicas``."""
        totals: dict[str, Any] = {"replicas": self.replicas}
        for replica in self._services.replicas(self._name):
            method = replica.stats
            remote = getattr(method, "remote", None)  # a Ray actor handle's method
            stats = await remote() if remote is not None else method()
            for key, value in stats.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    totals[key] = totals.get(key, 0) + value
        return totals

    async def aclose(self) -> None:
        """Nothing to close here: the replicas belong to the namespace (see ``ray_judge``)."""


def ray_judge(
    address: str | None,
    *,
    namespace: str,
    concurrency: int,
    memory_limit_mb: int,
    **options: Any,
) -> RemoteJudge:
    """Connect to the Ray cluster at ``address`` and get (or create) the judge's replicas.

    One replica per alive node, spread by Ray (``SPREAD``); a server started later with
    the same ``namespace`` uses the same replicas. They stay until the namespace is
    reset (``get_services("ray", namespace=...).reset()``). ``options``: more of
    :class:`CodeJudge`'s (``image``...: each replica pulls the image on its own node).
    """
    init = {"address": address} if address else {}
    services = get_services("ray", namespace=namespace, ray_init_config=init)
    import ray

    listed: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    nodes = len([node for node in listed if node.get("Alive")])
    services.get_or_register(
        SERVICE,
        CodeJudge,
        concurrency=concurrency,
        memory_limit_mb=memory_limit_mb,
        num_replicas=max(1, nodes),
        **options,
    )
    return RemoteJudge(services, SERVICE, concurrency=concurrency)
