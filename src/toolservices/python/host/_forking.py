"""``fork_session``'s parent side: copy one live interpreter into new sessions.

The source worker forks itself (a double fork, so that the copies become
children of the fork server), each copy gets a fresh socketpair end passed
over the source's channel with ``SCM_RIGHTS`` and its own working directory
in the source's lineage, and the server adopts the copies as sessions. The
control channel is held throughout, so no sweep can mistake a copy in flight
for an orphan.

``spawn_with_files`` (:func:`seeded_handles`) makes fresh sessions instead,
which the fork server seeds with a copy of the source's files (``_seed``):
nothing of the source's memory travels.
"""

from __future__ import annotations

import contextlib
import socket

import anyio

from toolservices.errors import InfrastructureError
from toolservices.python.host._channel import Channel
from toolservices.python.host._client import (
    MAX_META,
    SEED_START_TIMEOUT,
    ForkServerClient,
    SessionHandle,
)
from toolservices.python.runtime import (
    Adopt,
    Error,
    Fork,
    Kind,
    Mkdirs,
    ProtocolViolation,
    Release,
)

__all__ = ["FORK_TIMEOUT", "fork_handles", "seeded_handles"]

#: the FORK request: n forks of a warm interpreter take milliseconds each
FORK_TIMEOUT = 30.0


async def fork_handles(server: ForkServerClient, src: SessionHandle, n: int) -> list[SessionHandle]:
    """Ask ``src`` to fork itself ``n`` times; adopt the copies as sessions of the server."""
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(n)]
    handles: list[SessionHandle] = []
    workdirs: list[str] = []
    failure: str | None = None
    source_ok = False
    async with server.exclusive():
        try:
            workdirs = (await server.request_locked(Mkdirs(n=n, src=src.workdir))).workdirs or []
            theirs = tuple(b.fileno() for _, b in pairs)
            with anyio.fail_after(FORK_TIMEOUT):
                try:
                    frame = await src.chan.request(
                        Fork(workdirs=workdirs, source=src.workdir),
                        expect=(Kind.FORKED, Kind.ERROR),
                        timeout=None,  # this scope bounds the whole fork
                        fds=theirs,
                    )
                finally:
                    for _, b in pairs:
                        b.close()
                if frame.kind == Kind.ERROR:  # the source stays usable
                    source_ok = True
                    raise ProtocolViolation(Error.decode(frame).error)
                source_ok = True  # from here on only the copies can fail
                for (ours, _), workdir in zip(pairs, workdirs, strict=True):
                    handle = SessionHandle(server, Channel(ours, max_body=MAX_META), workdir)
                    handles.append(handle)
                    handle._accept_hello(await handle.chan.recv())
            adopt = [[h.pid, h.workdir] for h in handles]
            await server.request_locked(Adopt(sessions=adopt))
        except (ProtocolViolation, TimeoutError, OSError) as exc:
            failure = f"fork_session failed: {exc}"
            for handle in handles:
                handle.abandon()
            for ours, theirs_sock in pairs:
                ours.close()
                theirs_sock.close()
            with contextlib.suppress(InfrastructureError):
                await server.request_locked(Release(workdirs=workdirs))
    if failure is not None:
        if not source_ok:
            await src.kill()  # its state is unknown now
        raise InfrastructureError(failure, retryable=True)
    return handles


async def seeded_handles(
    server: ForkServerClient, seed: SessionHandle, n: int
) -> list[SessionHandle]:
    """``n`` sessions seeded with ``seed``'s files, copied at the same time (each copy's
    work is in its own processes); all of them, or none and the first failure."""
    started: list[tuple[socket.socket, str]] = []
    results: list[SessionHandle | BaseException | None] = [None] * n
    failure: BaseException | None = None
    try:
        for _ in range(n):
            started.append(await server.start_spawn(seed=seed))
    except BaseException as exc:  # those already started still say HELLO: take them down
        failure = exc

    async def connect(index: int, sock: socket.socket, workdir: str) -> None:
        try:
            results[index] = await SessionHandle.connect(
                server, sock, workdir, start_timeout=SEED_START_TIMEOUT
            )
        except Exception as exc:  # the handle killed itself
            results[index] = exc

    try:
        with anyio.CancelScope(shield=failure is not None):
            async with anyio.create_task_group() as group:
                for index, (sock, workdir) in enumerate(started):
                    group.start_soon(connect, index, sock, workdir)
        failure = failure or next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            raise failure
    except BaseException:  # cancelled, or one failed: none of them is handed out
        with anyio.CancelScope(shield=True):
            for result in results:
                if isinstance(result, SessionHandle):
                    try:
                        await result.kill()
                    except InfrastructureError:
                        continue  # the server is gone: its sweep took the session
        raise
    return [r for r in results if isinstance(r, SessionHandle)]
