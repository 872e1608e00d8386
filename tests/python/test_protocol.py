"""The typed protocol: one message per frame kind, and the parent's one request/reply helper."""

from __future__ import annotations

import socket
import threading

import anyio
import pytest

from toolservices.python.host._channel import Channel
from toolservices.python.runtime import _protocol as protocol
from toolservices.python.runtime._protocol import (
    Frame,
    Kill,
    Kind,
    Ok,
    ProtocolViolation,
    Result,
    recv_frame,
    send_message,
)

SAMPLES: list[protocol.Message] = [
    protocol.Exec("print('\udcff')"),  # a lone surrogate survives the round trip
    protocol.Fork(workdirs=["/w/f1", "/w/f2"], source="/w/w0"),
    protocol.Hello(pid=42),
    protocol.Result(rc=1, exc={"type": "ValueError", "message": "x"}, dur=0.5, dropped=[3, 0]),
    protocol.Result(fatal="the output capture files were closed or replaced"),
    protocol.Forked(n=2),
    protocol.Config(max_output=1024, busy_poll=0.0005, preload=["json"]),
    protocol.Config(max_output=1024, preload_code="import sys\nsys.x = 1\n"),
    protocol.Spawn(),
    protocol.Kill(workdir="/w/s1/w0"),
    protocol.Discard(workdir="/w/s1/w0"),
    protocol.Mkdirs(n=3, src="/w/s1/w0"),
    protocol.Adopt(sessions=[[7, "/w/s1/f1"]]),
    protocol.Release(workdirs=["/w/s1/f1"]),
    protocol.Ready(pid=9, preload_failed={"nope": "ModuleNotFoundError: nope"}, python="3.11"),
    protocol.Ok(pid=7, workdir="/w/s1/w0"),
    protocol.Error(error="ValueError: fork source is not a live session"),
]


def test_every_frame_kind_has_one_message_class() -> None:
    kinds = {v for k, v in vars(Kind).items() if not k.startswith("_")}
    assert set(protocol.MESSAGES) == kinds
    assert {type(m).KIND for m in SAMPLES} == kinds


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_messages_round_trip_through_a_socket(message: protocol.Message) -> None:
    a, b = socket.socketpair()
    with a, b:
        send_message(a, message, 1234)
        frame = recv_frame(b, max_body=1 << 16)
    assert (frame.kind, frame.seq) == (message.KIND, 1234)
    assert protocol.decode(frame) == message


def test_malformed_messages_are_protocol_violations() -> None:
    with pytest.raises(ProtocolViolation, match="malformed Kill"):
        Kill.decode(Frame(Kind.KILL, 1, b'{"workdir": "/w", "extra": 1}'))
    with pytest.raises(ProtocolViolation, match="must be an object"):
        Kill.decode(Frame(Kind.KILL, 1, b'["/w"]'))
    with pytest.raises(ProtocolViolation, match="expected a Result frame"):
        Result.decode(Frame(Kind.OK, 1, b"{}"))
    with pytest.raises(ProtocolViolation, match="unknown frame kind"):
        protocol.decode(Frame(99, 1, b"{}"))


def test_new_seq_is_random_nonzero_and_never_repeats_the_last() -> None:
    seqs = [protocol.new_seq(0)]
    for _ in range(200):
        seqs.append(protocol.new_seq(seqs[-1]))
    assert 0 not in seqs and all(a != b for a, b in zip(seqs, seqs[1:], strict=False))
    assert len(set(seqs)) > 150  # drawn at random, not counted


def _answer(sock: socket.socket, replies: list[tuple[int, int | None]]) -> None:
    """Serve one request per entry: reply with (kind, seq), seq None meaning the request's."""
    for kind, seq in replies:
        frame = recv_frame(sock, max_body=1 << 16)
        send_message(
            sock,
            Ok(status=frame.seq) if kind == Kind.OK else protocol.Error("e"),
            frame.seq if seq is None else seq,
        )


@pytest.mark.anyio
async def test_request_owns_sequence_numbers_and_checks_the_reply() -> None:
    a, b = socket.socketpair()
    peer = threading.Thread(
        target=_answer,
        args=(b, [(Kind.OK, None), (Kind.OK, None), (Kind.OK, 1), (Kind.ERROR, None)]),
    )
    peer.start()
    chan = Channel(a, max_body=1 << 16)
    try:
        with anyio.fail_after(10):
            first = await chan.request(Kill("/w"), expect=(Kind.OK,), timeout=5)
            second = await chan.request(Kill("/w"), expect=(Kind.OK,), timeout=5)
            # each request drew its own number, and the reply carried it back
            assert Ok.decode(first).status == first.seq
            assert first.seq != second.seq and 0 not in (first.seq, second.seq)
            assert second.seq == chan.seq
            with pytest.raises(ProtocolViolation, match="seq 1"):  # not this request's number
                await chan.request(Kill("/w"), expect=(Kind.OK,), timeout=5)
            with pytest.raises(ProtocolViolation, match="kind 32"):  # a kind not expected
                await chan.request(Kill("/w"), expect=(Kind.OK,), timeout=5)
    finally:
        chan.close()
        peer.join(10)
        b.close()


@pytest.mark.anyio
async def test_request_times_out_without_a_reply() -> None:
    a, b = socket.socketpair()
    chan = Channel(a, max_body=1 << 16)
    try:
        with pytest.raises(TimeoutError):
            await chan.request(Kill("/w"), expect=(Kind.OK,), timeout=0.2)
        assert recv_frame(b, max_body=1 << 16).kind == Kind.KILL  # it was sent
    finally:
        chan.close()
        b.close()
