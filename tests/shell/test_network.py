"""network="none" | "loopback" | "host": real servers, real sessions, real namespaces."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from toolservices.errors import UserError
from toolservices.python import PythonExecutorService
from toolservices.shell import ShellService

# A server that says "ready" on a fifo once it listens (the client waits on the fifo:
# a rendezvous, no sleep), then answers one connection per line of the fifo's reader.
_SERVER = r"""
import os, socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
with open("ready", "w") as f:
    f.write(str(s.getsockname()[1]) + "\n")
while True:
    c, _ = s.accept(); c.sendall(b"hello from the session\n"); c.close()
"""
_CLIENT = (
    "import socket,sys; c=socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5);"
    "print(c.recv(100).decode().strip())"
)
_CONNECT = (
    "import socket,sys; s=socket.socket(); s.settimeout(5);"
    "print(s.connect_ex(('127.0.0.1', int(sys.argv[1]))))"
)


@pytest.fixture
def host_server() -> Iterator[int]:
    """A server on the host's 127.0.0.1, accepting until the test ends."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(b"hello from the host\n")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(5)


def _start_server(shell: ShellService, sid: str) -> int:
    shell.write_file("server.py", _SERVER, session_id=sid)
    result = shell.run(
        "mkfifo ready && (python3 server.py >/dev/null 2>&1 &) && read port < ready && echo $port",
        session_id=sid,
    )
    assert result.returncode == 0, result
    return int(result.stdout)


def test_loopback_is_the_default_and_private_to_each_session(host_server: int) -> None:
    with ShellService(pool_size=2, timeout=20.0, max_sessions=8) as shell:
        layer = shell.isolation_report()["layers"]["network"]
        if not layer["active"] or "loopback" not in layer.get("detail", ""):
            pytest.skip(f"no per-session network namespaces here: {layer}")
        port = _start_server(shell, "a")
        talk = shell.run(f'python3 -c "{_CLIENT}" {port}', session_id="a")
        assert talk.stdout == "hello from the session\n", talk
        # Another session has its own lo: the server is not there.
        other = shell.run(f'python3 -c "{_CONNECT}" {port}', session_id="b")
        assert other.stdout.strip() == "111", other  # ECONNREFUSED
        # The host's loopback is not the session's.
        host = shell.run(f'python3 -c "{_CONNECT}" {host_server}', session_id="a")
        assert host.stdout.strip() == "111", host
        outside = shell.run(
            'python3 -c "import socket; s=socket.socket(); s.settimeout(2);'
            "print(s.connect_ex(('10.0.0.1', 80)))\"",
            session_id="a",
        )
        assert outside.stdout.strip() == "101", outside  # ENETUNREACH: no route but lo


def test_none_refuses_inet_sockets() -> None:
    with ShellService(pool_size=1, timeout=20.0, max_sessions=4, network="none") as shell:
        report = shell.isolation_report()["layers"]
        if not report["seccomp"]["active"]:
            pytest.skip(f"seccomp is off here: {report['seccomp']}")
        result = shell.run(
            'python3 -c "import socket\ntry:\n socket.socket()\n'
            'except OSError as e: print(e.errno)"',
            session_id="n",
        )
        assert result.stdout.strip() == "97", result  # EAFNOSUPPORT


def test_host_reaches_the_hosts_loopback(host_server: int) -> None:
    with ShellService(pool_size=1, timeout=20.0, max_sessions=4, network="host") as shell:
        assert shell.sandbox.network == "host"
        result = shell.run(f'python3 -c "{_CLIENT}" {host_server}', session_id="h")
        assert result.stdout == "hello from the host\n", result


def test_python_sessions_get_their_own_loopback() -> None:
    with PythonExecutorService(pool_size=1, timeout=20.0, max_sessions=4) as python:
        assert python.sandbox.network == "loopback"
        if "loopback" not in python.isolation_report()["layers"]["network"].get("detail", ""):
            pytest.skip("no per-session network namespaces here")
        code = (
            "import socket\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "c = socket.create_connection(s.getsockname(), timeout=5)\n"
            "a, _ = s.accept(); a.sendall(b'ping'); print(c.recv(4))\n"
        )
        assert python.execute(code, session_id="p").stdout == "b'ping'\n"


@pytest.mark.parametrize("bad", ["wifi", 1, None.__class__])
def test_bad_network_mode_is_a_user_error(bad: object) -> None:
    with pytest.raises(UserError, match="network must be one of 'none', 'loopback', 'host'"):
        ShellService(network=bad)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="network must be one of"):
        PythonExecutorService(network=bad)  # type: ignore[arg-type]
