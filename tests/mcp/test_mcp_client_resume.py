"""Our client over a connection that drops a call's event stream: the result still arrives.

A proxy between ``MCPToolset`` and our HTTP server cuts the event stream of a
``wait_for`` call right after its first event. The SDK client reconnects with
``Last-Event-ID`` (our server sent ids and a ``retry`` hint) and the server's
event store replays the result.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Callable

import httpx2
from tests.mcp.conftest import SERVE_TOOLS

from toolservices.mcp import HttpServer, MCPToolset

WAIT = 30.0
_HOP = {"host", "content-length", "connection", "transfer-encoding", "content-encoding"}


class _Cutter(http.server.ThreadingHTTPServer):
    """Forwards everything to ``upstream``, streaming; cuts the first ``wait_for`` stream."""

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Forward)
        self.upstream = upstream
        self.http = httpx2.Client(timeout=httpx2.Timeout(WAIT, read=None))
        self.cut = threading.Event()  # set once the stream was cut
        self.resumed_from: list[str] = []  # Last-Event-ID of the GETs that came through

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/mcp"


class _Forward(http.server.BaseHTTPRequestHandler):
    server: _Cutter
    protocol_version = "HTTP/1.0"  # the end of a body is the end of the connection

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        if self.command == "GET" and "last-event-id" in {k.lower() for k in headers}:
            self.server.resumed_from.append(self.headers["Last-Event-ID"])
        cut = not self.server.cut.is_set() and b'"wait_for"' in body
        request = self.server.http.build_request(
            self.command, self.server.upstream, content=body or None, headers=headers
        )
        upstream = self.server.http.send(request, stream=True)
        try:
            self.send_response(upstream.status_code)
            for key, value in upstream.headers.items():
                if key.lower() not in _HOP:
                    self.send_header(key, value)
            self.end_headers()
            seen = b""
            for chunk in upstream.iter_raw():
                self.wfile.write(chunk)
                self.wfile.flush()
                seen += chunk
                if cut and (b"\n\n" in seen or b"\r\n\r\n" in seen):  # the first event is through
                    self.server.cut.set()
                    return
        except OSError:
            return  # our client went away
        finally:
            upstream.close()

    do_GET = do_POST = do_DELETE = _forward  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


def test_a_cut_event_stream_is_resumed_and_the_result_arrives(
    announced_server: Callable[..., tuple[subprocess.Popen[str], str]],
) -> None:
    _, upstream = announced_server([sys.executable, SERVE_TOOLS, "http"])
    with _Cutter(upstream) as proxy:
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        try:
            with MCPToolset({"p": HttpServer(url=proxy.url)}, timeout=WAIT) as ts:
                outcome: list[object] = []
                caller = threading.Thread(
                    target=lambda: outcome.append(ts.call("p.wait_for", {"gate": "cut"}).text)
                )
                caller.start()
                assert proxy.cut.wait(WAIT)
                # The call runs on while its stream is gone; let it finish now.
                assert ts.call("p.release", {"gate": "cut"}).text == "released"
                caller.join(WAIT)
                assert outcome == ["cut passed"]
        finally:
            proxy.shutdown()
            proxy.http.close()
    assert proxy.resumed_from, "the client did not reconnect with Last-Event-ID"
    json.dumps(proxy.resumed_from)  # ids are plain strings
