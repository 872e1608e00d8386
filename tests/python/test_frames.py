"""The framing layer and the result type, without processes."""

from __future__ import annotations

import os
import socket
import struct

import anyio
import anyio.lowlevel
import pytest

from toolservices.python import ExecResult
from toolservices.python.host._channel import Channel
from toolservices.python.host._result import ExceptionInfo
from toolservices.python.runtime._protocol import (
    HEADER,
    Kind,
    PeerClosed,
    ProtocolViolation,
    recv_frame,
    send_frame,
)


def test_round_trip_with_descriptors() -> None:
    a, b = socket.socketpair()
    r, w = os.pipe()
    with a, b:
        send_frame(a, Kind.EXEC, 7, b"print(1)", (w,))
        frame = recv_frame(b, max_body=100)
        assert (frame.kind, frame.seq, frame.body, len(frame.fds)) == (Kind.EXEC, 7, b"print(1)", 1)
        os.write(frame.fds[0], b"x")
        assert os.read(r, 1) == b"x"
        for fd in (r, w, *frame.fds):
            os.close(fd)


def test_oversized_and_truncated_frames() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(HEADER.pack(1 << 30, 1, Kind.RESULT))
        with pytest.raises(ProtocolViolation, match="exceeds"):
            recv_frame(b, max_body=1 << 20)
    a, b = socket.socketpair()
    with b:
        a.sendall(HEADER.pack(10, 1, Kind.RESULT) + b"abc")
        a.close()
        with pytest.raises(PeerClosed):
            recv_frame(b, max_body=100)


def test_malformed_json_body() -> None:
    a, b = socket.socketpair()
    with a, b:
        send_frame(a, Kind.RESULT, 1, b"\xff{not json")
        with pytest.raises(ProtocolViolation, match="malformed"):
            recv_frame(b, max_body=100).json()


@pytest.mark.anyio
async def test_async_channel_frames_stray_data_and_eof() -> None:
    a, b = socket.socketpair()
    chan = Channel(a, max_body=1 << 16)
    try:
        assert not chan.has_stray_data()
        # two frames in one write, the second split: both come out whole, in order
        data = struct.pack("<IIB", 2, 1, Kind.RESULT) + b"{}" + struct.pack("<IIB", 2, 2, 11)
        b.sendall(data)
        with anyio.fail_after(5):
            first = await chan.recv()
            b.sendall(b"[]")
            second = await chan.recv()
        assert (first.seq, first.body, second.seq, second.body) == (1, b"{}", 2, b"[]")
        b.sendall(b"junk")
        with anyio.fail_after(5):
            while not chan.has_stray_data():  # noqa: ASYNC110 - the bytes are in flight
                await anyio.lowlevel.checkpoint()
        b.close()
    finally:
        chan.close()


@pytest.mark.anyio
async def test_async_channel_reports_peer_exit() -> None:
    a, b = socket.socketpair()
    chan = Channel(a, max_body=100)
    try:
        await chan.send(Kind.EXEC, 1, b"x")
        assert recv_frame(b, max_body=100).body == b"x"
        b.close()
        with anyio.fail_after(5), pytest.raises(PeerClosed):
            await chan.recv()
        with pytest.raises(PeerClosed):
            await chan.send(Kind.EXEC, 2, b"y" * 1_000_000)
    finally:
        chan.close()


def test_exec_result_mapping() -> None:
    result = ExecResult(
        success=False,
        stdout="",
        stderr="boom",
        returncode=1,
        exception=ExceptionInfo(type="ValueError", message="boom"),
    )
    assert result["exception"] == {"type": "ValueError", "message": "boom"}
    assert result.get("missing", 3) == 3
    with pytest.raises(KeyError):
        result["missing"]
    assert len(result) == len(result.to_dict()) and "state_lost" not in result
    assert result == result.to_dict()
    assert "ValueError" in repr(result)
