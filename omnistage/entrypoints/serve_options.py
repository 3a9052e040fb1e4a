"""The options of `omnistage serve` (and `omnistage playground`) that are the server's own:
where it listens, who may call it, how long a slow client may take, the playground, and
whether a pipeline's stages run in processes. The engine's options are the CLI's."""

from __future__ import annotations

import argparse
import math


def positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def connection_cap(text: str) -> int:
    """argparse type: an integer >= 2 (uvicorn counts the new connection itself)."""
    if not text.strip().isdigit() or int(text) < 2:
        raise argparse.ArgumentTypeError(f"expected an integer >= 2, got {text!r}")
    return int(text)


def add_serve_options(srv: argparse.ArgumentParser, ui: bool) -> None:
    """The server's options on `srv`; `ui`: the playground is on by default."""
    srv.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (0.0.0.0: all)")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument(
        "--api-key", default=None, help="require Authorization: Bearer KEY (or $OMNISTAGE_API_KEY)"
    )
    srv.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="name(s) requests give as `model` (default: the --model argument)",
    )
    srv.add_argument(
        "--max-request-bytes",
        type=int,
        default=64 * 1024 * 1024,  # http_guards.DEFAULT_MAX_REQUEST_BYTES (not imported here)
        help="larger request bodies get a 413 (default 64 MiB)",
    )
    srv.add_argument(
        "--header-timeout-s",
        type=positive_seconds,
        default=10.0,
        help="close a connection whose request header is not complete in this time",
    )
    srv.add_argument(
        "--read-timeout-s",
        type=positive_seconds,
        default=30.0,
        help="a request body not received in this time (+1 s per KiB) is a 408",
    )
    srv.add_argument(
        "--max-connections",
        type=connection_cap,
        default=1024,
        help="open connections beyond which a new request gets a 503",
    )
    srv.add_argument(
        "--ui",
        action="store_true",
        default=ui,
        help="also serve a browser playground at /ui/ (GET / redirects there)",
    )
    srv.add_argument("--seed", type=int, default=None, help="engine seed (unseeded requests)")
    srv.add_argument("--log-level", default="info", help="uvicorn log level")
    srv.add_argument(
        "--deploy",
        default=None,
        help="serve a multi-stage pipeline from a deploy file or packaged name (demo-image, "
        "demo-omni, ...); demos and omni / image checkpoints given as --model get theirs",
    )
    srv.add_argument(
        "--in-process",
        action="store_true",
        help="run a pipeline's stages in the server process (no stage processes)",
    )
