"""An executor face over a registered ``PythonExecutorService``, for episodes.

:class:`~toolservices.env.Episode`, :class:`~toolservices.env.ToolEnv` and
``python_tool`` talk to an executor through ``aexecute`` / ``aclose_session``
(and ``afork_session`` for ``Episode.fork``). When the executor is a service
of a registry (Ray actors, possibly several replicas on several nodes), this
object gives them that face on top of a :class:`ServiceClient`, so each
session id is routed to the replica holding its interpreter from whichever
worker the episode runs in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from toolservices.errors import UserError

if TYPE_CHECKING:
    from toolservices.services.base import ServiceClient

__all__ = ["ServiceExecutor"]


class ServiceExecutor:
    """``aexecute`` / ``execute`` / ``aclose_session`` through a service client.

    ``timeout`` is the executor's own limit per call (what ``python_tool``
    adds its grace period to); pass the value the service was registered
    with. Forking a session is refused on a service with several replicas:
    the copies' new ids would be routed to other replicas than the one that
    holds the copied interpreters.
    """

    def __init__(self, client: ServiceClient, *, timeout: float = 10.0) -> None:
        self.client = client
        self.timeout = float(timeout)

    async def aexecute(self, code: str, *, session_id: str | None = None) -> Any:
        return await self.client.acall("execute", code, session_id=session_id)

    def execute(self, code: str, *, session_id: str | None = None) -> Any:
        return self.client.call("execute", code, session_id=session_id)

    async def aclose_session(self, session_id: str) -> bool:
        return bool(await self.client.acall("close_session", session_id=session_id))

    async def afork_session(self, src_session_id: str, n: int = 1) -> list[str]:
        if self.client.num_replicas > 1:
            raise UserError(
                f"Cannot fork sessions of service '{self.client.name}': it has "
                f"{self.client.num_replicas} replicas and the copies would be routed to other "
                "replicas than the one holding them; use a single-replica service for fork()"
            )
        return list(await self.client.acall("fork_session", src_session_id, n))

    def __repr__(self) -> str:
        return f"ServiceExecutor({self.client!r}, timeout={self.timeout})"
