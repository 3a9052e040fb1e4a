"""Connectors: one contract for inproc, shm and zmq; cross-process use; nothing leaks."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import msgspec
import pytest
import torch

from omnistage.core.payload import PayloadError
from omnistage.pipeline.connectors import (
    Connector,
    ConnectorHealth,
    PayloadHandle,
    connector_options,
    make_connector,
    parse_payload_key,
    payload_key,
    unlink_namespace,
)
from omnistage.pipeline.connectors.shm import namespace_segments

KINDS = ["inproc", "shm", "zmq"]
EDGE = "talker->code2wav"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _payload(i: int = 0) -> dict:
    g = torch.Generator().manual_seed(i)
    return {
        "hidden_states.output": torch.randn(3 + i % 4, 8, generator=g).to(torch.bfloat16),
        "codes.audio": torch.randint(0, 4096, (2, 5), generator=g),
        "audio.waveform": torch.randn(17, generator=g, dtype=torch.float64),
        "meta.chunk_index": i,
        "meta.finished": i % 2 == 0,
        "meta.request_id": f"req-{i}",
    }


def _assert_equal(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            assert b[key].dtype == value.dtype and torch.equal(b[key], value), key
        else:
            assert b[key] == value, key


def _never_put_handle(kind: str, producer: Connector, key: str, location: str) -> PayloadHandle:
    """A handle for a key nobody put (nbytes 0: not a handle that put() returned)."""
    if kind == "shm":
        location = producer.segment_name(key)  # type: ignore[attr-defined]
    return PayloadHandle(producer.name, key, location, 0)


@pytest.fixture
def namespace():
    ns = uuid.uuid4().hex[:12]
    yield ns
    leftover = namespace_segments(ns)
    unlink_namespace(ns)
    assert leftover == [], f"shared-memory segments leaked: {leftover}"


@pytest.fixture(params=KINDS)
def pair(request, namespace):
    """(kind, producer, consumer): two instances of one connector, as two stages hold them."""
    producer = make_connector("edge", request.param, {"timeout_s": 5}, namespace=namespace)
    consumer = make_connector("edge", request.param, {"timeout_s": 5}, namespace=namespace)
    yield request.param, producer, consumer
    consumer.close()
    producer.close()


def test_put_get_round_trip_is_an_exact_copy(pair):
    kind, producer, consumer = pair
    payload = _payload(3)
    handle = producer.put(payload_key("r1", EDGE, 0), payload)
    assert handle.connector == "edge" and handle.key == "r1/talker->code2wav/0"
    assert handle.nbytes > 0 and producer.num_pending() == 1
    sent = payload["codes.audio"].clone()
    payload["codes.audio"].zero_()  # the producer reusing its buffers must not reach the consumer
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(handle), type=PayloadHandle)
    got = consumer.get(wire)
    _assert_equal({**payload, "codes.audio": sent}, got)
    assert producer.num_pending() == 0 and consumer.num_pending() == 0


def test_consume_once(pair):
    _, producer, consumer = pair
    handle = producer.put(payload_key("r1", EDGE, 0), _payload())
    consumer.get(handle)
    start = time.monotonic()
    with pytest.raises(ValueError, match="r1/talker->code2wav/0"):
        consumer.get(handle)
    assert time.monotonic() - start < 1.0  # known gone: no waiting for the timeout


def test_cleanup_drops_one_request_only(pair):
    kind, producer, consumer = pair
    cleaner = producer if kind == "zmq" else consumer  # shm/inproc: any instance reaches all
    mine = [
        producer.put(payload_key("r/1", e, c), _payload(c))
        for e in ("a->b", "b->c")
        for c in (0, 1)
    ]
    other = producer.put(payload_key("r/10", "a->b", 0), _payload(9))
    assert producer.num_pending() == 5
    assert cleaner.cleanup("r/1") == 4
    assert cleaner.cleanup("r/1") == 0  # idempotent
    assert producer.num_pending() == 1
    for handle in mine:
        with pytest.raises(ValueError, match="consumed or cleaned up"):
            consumer.get(handle, timeout=1.0)
    _assert_equal(_payload(9), consumer.get(other))
    assert producer.num_pending() == 0 and consumer.num_pending() == 0


def test_get_never_put_key_times_out_naming_it(pair):
    kind, producer, consumer = pair
    real = producer.put(payload_key("r1", EDGE, 0), _payload())  # zmq: a live producer
    key = payload_key("never", EDGE, 7)
    handle = _never_put_handle(kind, producer, key, real.location)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="never/talker->code2wav/7"):
        consumer.get(handle, timeout=0.3)
    assert 0.29 < time.monotonic() - start < 1.5
    producer.cleanup("r1")


def test_put_refuses_bad_keys_payloads_and_duplicates(pair):
    kind, producer, consumer = pair
    key = payload_key("r1", EDGE, 0)
    with pytest.raises(PayloadError, match="'meta.chunk_idx'.*'meta.chunk_index'"):
        producer.put(key, {"meta.chunk_idx": 1})
    with pytest.raises(ValueError, match="payload_key"):
        producer.put("no-slashes", _payload())
    producer.put(key, _payload())
    with pytest.raises(ValueError, match="already held"):
        producer.put(key, _payload())
    other = make_connector("other", kind, {}, namespace=producer.namespace)
    with pytest.raises(ValueError, match="belongs to connector 'edge'"):
        other.get(PayloadHandle("edge", key, "", 1))
    other.close()
    assert producer.cleanup("r1") + consumer.cleanup("r1") == 1


def test_health_and_close(pair):
    kind, producer, consumer = pair
    health = producer.health()
    assert isinstance(health, ConnectorHealth) and health.ok and health.pending == 0
    producer.put(payload_key("r1", EDGE, 0), _payload())
    assert producer.health().pending == 1
    producer.cleanup("r1")
    consumer.close()
    assert not consumer.health().ok
    with pytest.raises(RuntimeError, match="closed"):
        consumer.get(PayloadHandle("edge", payload_key("r1", EDGE, 0), "", 1))


def test_payload_key_rules():
    assert payload_key("a/b", "x->y", 3) == "a/b/x->y/3"
    assert parse_payload_key("a/b/x->y/3") == ("a/b", "x->y", 3)
    for request_id in (None, ""):
        with pytest.raises(ValueError, match="request_id"):
            payload_key(request_id, EDGE, 0)  # type: ignore[arg-type]
    for edge, chunk in (("", 0), ("a/b", 0), (EDGE, -1), (EDGE, True)):
        with pytest.raises(ValueError):
            payload_key("r", edge, chunk)
    with pytest.raises(ValueError):
        parse_payload_key("r/x")


def test_make_connector_validates(namespace):
    with pytest.raises(ValueError, match="unknown connector kind 'nccl'"):
        make_connector("e", "nccl", {}, namespace=namespace)
    with pytest.raises(ValueError, match="unknown option 'hots'"):
        make_connector("e", "zmq", {"hots": "x"}, namespace=namespace)
    with pytest.raises(ValueError, match="unknown option 'port'"):
        make_connector("e", "shm", {"port": 1}, namespace=namespace)
    with pytest.raises(ValueError, match="timeout_s"):
        make_connector("e", "inproc", {"timeout_s": 0}, namespace=namespace)
    with pytest.raises(ValueError, match="'port'"):
        make_connector("e", "zmq", {"port": 70000}, namespace=namespace)
    for bad in ("", "has_underscore", "x" * 40):
        with pytest.raises(ValueError, match="namespace"):
            make_connector("e", "inproc", {}, namespace=bad)
    assert {"host", "port", "timeout_s"} <= connector_options("zmq")


@pytest.mark.parametrize("kind", ["inproc", "shm"])
def test_namespaces_do_not_collide(kind, namespace):
    ns2 = uuid.uuid4().hex[:12]
    a = make_connector("edge", kind, {}, namespace=namespace)
    b = make_connector("edge", kind, {}, namespace=ns2)
    key = payload_key("r1", EDGE, 0)
    a.put(key, _payload(1))
    b.put(key, _payload(2))
    assert a.cleanup("r1") == 1 and b.num_pending() == 1
    b.cleanup_all()
    a.close()
    b.close()
    assert namespace_segments(ns2) == []


def test_inproc_get_waits_for_a_late_put(namespace):
    producer = make_connector("edge", "inproc", {}, namespace=namespace)
    consumer = make_connector("edge", "inproc", {}, namespace=namespace)
    key = payload_key("r1", EDGE, 0)
    timer = threading.Timer(0.1, producer.put, (key, _payload()))
    timer.start()
    _assert_equal(_payload(), consumer.get(PayloadHandle("edge", key, "", 0), timeout=5))
    timer.join()
    producer.put(payload_key("r2", EDGE, 0), _payload())
    producer.close()  # drops what it put and nobody consumed
    assert consumer.num_pending() == 0
    consumer.close()


def test_zmq_dead_producer_times_out(namespace):
    producer = make_connector("edge", "zmq", {}, namespace=namespace)
    consumer = make_connector("edge", "zmq", {}, namespace=namespace)
    handle = producer.put(payload_key("r1", EDGE, 0), _payload())
    producer.close()
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="r1/talker->code2wav/0"):
        consumer.get(handle, timeout=0.3)
    assert time.monotonic() - start < 1.5
    consumer.close()


@pytest.mark.parametrize("kind", KINDS)
def test_no_leaks_after_mixed_puts_gets_and_cleanups(kind, namespace):
    rng = random.Random(f"leak-{kind}")
    producer = make_connector("edge", kind, {"timeout_s": 2}, namespace=namespace)
    consumer = make_connector("edge", kind, {"timeout_s": 2}, namespace=namespace)
    cleaner = producer if kind == "zmq" else consumer
    live: dict[str, PayloadHandle] = {}  # the model: what must still be held
    done: list[PayloadHandle] = []
    small = {"ids.output": torch.arange(4), "meta.finished": False}
    for i in range(200):
        rid = f"req{rng.randrange(15)}"
        handle = producer.put(payload_key(rid, rng.choice(["a->b", "b->c"]), i), small)
        live[handle.key] = handle
        roll = rng.random()
        if roll < 0.45:
            handle = live.pop(rng.choice(sorted(live)))
            _assert_equal(small, consumer.get(handle))
            done.append(handle)
        elif roll < 0.6:
            rid = f"req{rng.randrange(15)}"
            dropped = [k for k in live if parse_payload_key(k)[0] == rid]
            assert cleaner.cleanup(rid) == len(dropped)
            done += [live.pop(k) for k in dropped]
        assert producer.num_pending() == len(live)
    for handle in rng.sample(done, 10):  # consumed or cleaned: refused, never served twice
        with pytest.raises(ValueError):
            consumer.get(handle)
    for rid in {parse_payload_key(k)[0] for k in live}:
        cleaner.cleanup(rid)
    assert producer.num_pending() == 0 and consumer.num_pending() == 0
    producer.close()
    consumer.close()
    assert namespace_segments(namespace) == []


_SHM_SCRIPT = """
import sys, msgspec, torch
from omnistage.pipeline.connectors import make_connector, payload_key
conn = make_connector("edge", "shm", {{}}, namespace="{ns}")
payload = {{"ids.output": torch.arange(6)}}
keep = conn.put(payload_key("keep", "a->b", 0), payload)
conn.get(conn.put(payload_key("r1", "a->b", 0), payload))
conn.put(payload_key("r2", "a->b", 0), payload)
assert conn.cleanup("r2") == 1
conn.close()
sys.stdout.write(msgspec.json.encode(keep).decode())
"""


@pytest.fixture(scope="module")
def shm_script():
    """A separate interpreter that puts, gets and cleans up on shm, then exits.

    Started once, in the background, by the first test that asks for it: starting
    an interpreter costs seconds (torch), so it overlaps with the spawn test.
    """
    namespace = uuid.uuid4().hex[:12]
    proc = subprocess.Popen(
        [sys.executable, "-W", "always", "-c", textwrap.dedent(_SHM_SCRIPT.format(ns=namespace))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    yield namespace, proc
    if proc.poll() is None:
        proc.kill()
    proc.communicate()
    unlink_namespace(namespace)


def _produce_in_child(namespace: str, n: int, handles, fetched) -> None:
    """Put n payloads on an shm and a zmq connector; send the handles to the parent."""
    connectors = {
        kind: make_connector("edge", kind, {}, namespace=namespace) for kind in ("shm", "zmq")
    }
    for i in range(n):
        for kind, connector in connectors.items():
            handle = connector.put(payload_key(f"req-{i % 2}", EDGE, i), _payload(i))
            handles.put((kind, msgspec.msgpack.encode(handle)))
    fetched.wait(60)  # a TCP producer serves from memory: stay up until fetched
    for connector in connectors.values():
        connector.close()


def test_cross_process_put_in_child_get_in_parent(namespace, shm_script):
    ctx = mp.get_context("spawn")
    handles, fetched = ctx.Queue(), ctx.Event()
    n = 5
    child = ctx.Process(target=_produce_in_child, args=(namespace, n, handles, fetched))
    child.start()
    try:
        received: dict[str, list[PayloadHandle]] = {"shm": [], "zmq": []}
        for _ in range(2 * n):
            kind, raw = handles.get(timeout=60)
            received[kind].append(msgspec.msgpack.decode(raw, type=PayloadHandle))
        zmq_consumer = make_connector("edge", "zmq", {}, namespace=namespace)
        for i, handle in enumerate(received["zmq"]):
            _assert_equal(_payload(i), zmq_consumer.get(handle, timeout=10))
        zmq_consumer.close()
        fetched.set()
        child.join(60)
        assert child.exitcode == 0
        # The producer has exited; its shared-memory segments have not.
        assert len(namespace_segments(namespace)) == n
        shm_consumer = make_connector("edge", "shm", {}, namespace=namespace)
        for i, handle in enumerate(received["shm"]):
            _assert_equal(_payload(i), shm_consumer.get(handle, timeout=10))
        shm_consumer.close()
    finally:
        if child.is_alive():
            child.kill()
    assert namespace_segments(namespace) == []


def test_shm_no_resource_tracker_warnings_and_segments_outlive_producer(shm_script):
    namespace, proc = shm_script
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert "resource_tracker" not in stderr and "leaked" not in stderr, stderr
    assert "Traceback" not in stderr, stderr
    keep = msgspec.json.decode(stdout, type=PayloadHandle)
    assert namespace_segments(namespace) == [keep.location]
    consumer = make_connector("edge", "shm", {}, namespace=namespace)
    assert torch.equal(consumer.get(keep)["ids.output"], torch.arange(6))
    consumer.close()
    assert namespace_segments(namespace) == []


def test_shm_hands_the_consumer_views_of_one_mapping_not_copies(namespace):
    """One copy in all (into the segment): the tensors a consumer gets are views of its
    private mapping of the claimed segment, laid out as packed, and writable (copy on
    write) without reaching anyone else."""
    producer = make_connector("edge", "shm", {"timeout_s": 5}, namespace=namespace)
    consumer = make_connector("edge", "shm", {"timeout_s": 5}, namespace=namespace)
    payload = _payload(1)
    got = consumer.get(producer.put(payload_key("r1", EDGE, 0), payload))
    _assert_equal(payload, got)
    hidden, codes = got["hidden_states.output"], got["codes.audio"]
    segment = _mapped_file(hidden.data_ptr())
    assert segment.startswith("/dev/shm/omni_") and segment.endswith("(deleted)"), segment
    assert _mapped_file(codes.data_ptr()) == segment
    codes += 1
    assert torch.equal(codes, payload["codes.audio"] + 1)
    del got, hidden, codes  # the mapping goes with its last view
    consumer.close()
    producer.close()


def _mapped_file(address: int) -> str:
    """What this process has mapped at `address` (from /proc/self/maps; "" if anonymous)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return fields[5].strip() if len(fields) > 5 else ""
    raise AssertionError(f"address {address:#x} is not mapped")
