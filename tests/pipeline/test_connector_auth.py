"""The TCP connector between machines authenticates (issue 22): with a shared secret every
request and reply carries an HMAC; a peer without the secret is refused by name, a
producer never hands it a payload, and binding beyond loopback needs a secret."""

from __future__ import annotations

import threading
import uuid

import pytest
import torch
import zmq

from omnistage.pipeline.connectors import PayloadHandle, make_connector, payload_key
from omnistage.pipeline.connectors.zmq_tcp import SECRET_ENV

EDGE = "talker->code2wav"
SECRET, OTHER = "s" * 16 + "-the-shared-one", "o" * 16 + "-another-one"


@pytest.fixture
def namespace():
    return uuid.uuid4().hex[:12]


def _pair(namespace, producer_secret, consumer_secret):
    def options(secret):
        return {"timeout_s": 2} | ({"secret": secret} if secret else {})

    producer = make_connector("edge", "zmq", options(producer_secret), namespace=namespace)
    consumer = make_connector("edge", "zmq", options(consumer_secret), namespace=namespace)
    return producer, consumer


def test_the_same_secret_on_both_sides_moves_payloads(namespace):
    producer, consumer = _pair(namespace, SECRET, SECRET)
    payload = {"hidden_states.output": torch.arange(12.0).reshape(3, 4), "meta.finished": True}
    handle = producer.put(payload_key("r1", EDGE, 0), payload)
    got = consumer.get(handle)
    assert torch.equal(got["hidden_states.output"], payload["hidden_states.output"])
    assert got["meta.finished"] is True and producer.num_pending() == 0
    producer.close()
    consumer.close()


@pytest.mark.parametrize(
    ("producer_secret", "consumer_secret"),
    [(SECRET, OTHER), (SECRET, None), (None, SECRET)],  # another secret, none on one side
)
def test_a_peer_without_the_secret_is_refused_and_gets_nothing(
    namespace, producer_secret, consumer_secret
):
    producer, consumer = _pair(namespace, producer_secret, consumer_secret)
    try:
        handle = producer.put(payload_key("r1", EDGE, 0), {"meta.finished": True})
        with pytest.raises(ValueError, match="refused the fetch"):
            consumer.get(handle)
        assert producer.num_pending() == 1  # a refused fetch takes nothing
    finally:
        producer.close()
        consumer.close()


def test_a_reply_that_fails_authentication_is_refused(namespace):
    """A rogue producer (a raw socket) answers without the secret's MAC."""
    _, consumer = _pair(namespace, None, SECRET)
    ctx = zmq.Context()
    rogue = ctx.socket(zmq.ROUTER)
    port = rogue.bind_to_random_port("tcp://127.0.0.1")

    def answer():
        identity, nonce, *_ = rogue.recv_multipart()
        rogue.send_multipart([identity, nonce, b"ok", b"payload", b"\0" * 32])

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    handle = PayloadHandle("edge", payload_key("r1", EDGE, 0), f"tcp://127.0.0.1:{port}", 7)
    try:
        with pytest.raises(ValueError, match="failed authentication"):
            consumer.get(handle)
    finally:
        thread.join(5)
        consumer.close()
        rogue.close(linger=0)
        ctx.destroy(linger=0)


def test_a_raw_socket_is_denied(namespace):
    producer, _ = _pair(namespace, SECRET, SECRET)
    handle = producer.put(payload_key("r1", EDGE, 0), {"meta.finished": True})
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(handle.location)
    sock.send_multipart([b"12345678", handle.key.encode()])
    assert sock.poll(5000) and sock.recv_multipart() == [b"12345678", b"denied"]
    sock.close(linger=0)
    ctx.destroy(linger=0)
    assert producer.num_pending() == 1
    producer.close()


def test_binding_beyond_loopback_needs_a_secret(namespace, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(ValueError, match="not loopback.*needs a shared secret"):
        make_connector("edge", "zmq", {"host": "0.0.0.0"}, namespace=namespace)
    with pytest.raises(ValueError, match="16 characters"):
        make_connector("edge", "zmq", {"host": "0.0.0.0", "secret": "short"}, namespace=namespace)
    make_connector(
        "edge", "zmq", {"host": "0.0.0.0", "secret": SECRET}, namespace=namespace
    ).close()
    make_connector("edge", "zmq", {"host": "::1"}, namespace=namespace).close()
    monkeypatch.setenv(SECRET_ENV, SECRET)  # or from the environment
    make_connector("edge", "zmq", {"host": "0.0.0.0"}, namespace=namespace).close()
