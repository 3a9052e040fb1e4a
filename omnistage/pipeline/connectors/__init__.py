"""Connectors: the transports of payloads between stages, and the factory deploy files use.

``make_connector(name, kind, options, namespace=...)`` builds one from an edge's
``connector:`` entry; kinds are ``inproc`` (same process), ``shm`` (same host,
the default) and ``zmq`` (TCP, other hosts). The interface is ``base.Connector``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omnistage.pipeline.connectors.base import (
    DEFAULT_TIMEOUT_S,
    Connector,
    ConnectorHealth,
    PayloadHandle,
    parse_payload_key,
    payload_key,
)
from omnistage.pipeline.connectors.inproc import InProcessConnector
from omnistage.pipeline.connectors.shm import SharedMemoryConnector, unlink_namespace
from omnistage.pipeline.connectors.zmq_tcp import ZmqConnector

CONNECTOR_KINDS: dict[str, type[Connector]] = {
    "inproc": InProcessConnector,
    "shm": SharedMemoryConnector,
    "zmq": ZmqConnector,
}


def connector_kinds() -> tuple[str, ...]:
    return tuple(sorted(CONNECTOR_KINDS))


def connector_options(kind: str) -> frozenset[str]:
    """The options a connector kind accepts (for deploy-file validation)."""
    return _kind(kind).OPTIONS


def make_connector(
    name: str, kind: str, options: Mapping[str, Any], *, namespace: str
) -> Connector:
    """Build the connector `name` of `kind`; ValueError naming an unknown kind or option.

    `namespace` is a short token (letters and digits) shared by all processes of one
    pipeline instance and unique to it, so two pipelines never see each other's data.
    """
    return _kind(kind)(name, options, namespace=namespace)


def _kind(kind: str) -> type[Connector]:
    try:
        return CONNECTOR_KINDS[kind]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown connector kind {kind!r}; known: {', '.join(connector_kinds())}"
        ) from None


__all__ = [
    "CONNECTOR_KINDS",
    "DEFAULT_TIMEOUT_S",
    "Connector",
    "ConnectorHealth",
    "InProcessConnector",
    "PayloadHandle",
    "SharedMemoryConnector",
    "ZmqConnector",
    "connector_kinds",
    "connector_options",
    "make_connector",
    "parse_payload_key",
    "payload_key",
    "unlink_namespace",
]
