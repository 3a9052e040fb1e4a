"""Errors in OpenAI's shape, and the exception handlers that produce them.

Every error the server answers is `{"error": {"message", "type", "param", "code"}}`
with a 4xx status for anything the client got wrong: invalid JSON, wrong types and
out-of-range values (pydantic's `RequestValidationError`, which FastAPI would answer
with a 422 of its own shape), unknown routes and methods, and the engine's own
`ValueError`s, whose messages start with the field they are about ("max_tokens: ...").
Only a failure of the server itself is a 5xx.

No answer shows the server's insides: `public_text` takes the memory addresses out of
object reprs (`<... object at 0x7f...>`) and replaces a traceback by its last line, for
every error built here (`error_info`: whole responses and stream events alike); the
full text goes to the server's log.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from omnistage.entrypoints.openai.client import EngineDeadError
from omnistage.entrypoints.openai.protocol import ErrorInfo, ErrorResponse

logger = logging.getLogger(__name__)

_FIELD_PREFIX = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\[\d+\])?: ")
_FIELD_PATH = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)[\[.:]")
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}
_AT_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+\b")
_BARE_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{9,}\b")  # 9+ digits: an address, not a size
_TRACE_START = re.compile(
    r"Traceback \(most recent call last\):|^.*\(most recent call first\):|^[ \t]+File \"",
    re.MULTILINE,
)


class OpenAIError(Exception):
    """An error to answer in OpenAI's shape with `status`."""

    def __init__(
        self,
        message: str,
        status: int = HTTPStatus.BAD_REQUEST,
        param: str | None = None,
        type: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = int(status)
        self.param = param
        self.type = type or ("invalid_request_error" if self.status < 500 else "server_error")
        self.code = code

    def response(self) -> JSONResponse:
        return error_response(self.message, self.status, self.param, self.type, self.code)

    @classmethod
    def from_value_error(
        cls, exc: ValueError, params: Mapping[str, str] | None = None
    ) -> OpenAIError:
        """A 400 for an engine `ValueError` ("field: what is wrong"); `params` renames the
        engine's field names to the request's (e.g. prompt -> messages)."""
        message = str(exc)
        match = _FIELD_PREFIX.match(message)
        param = match.group(1) if match else None
        if param is not None and params and param in params:
            param = params[param]
            message = f"{param}: {message[match.end() :]}"
        return cls(message, HTTPStatus.BAD_REQUEST, param)


class ClientDisconnected(Exception):
    """The client closed the connection before its response was ready (nobody to answer)."""


def error_response(
    message: str,
    status: int,
    param: str | None = None,
    type: str | None = None,
    code: str | None = None,
) -> JSONResponse:
    info = error_info(message, status, param, type, code)
    return JSONResponse(ErrorResponse(error=info).model_dump(), status_code=status)


def error_info(
    message: str,
    status: int,
    param: str | None = None,
    type: str | None = None,
    code: str | int | None = None,
) -> ErrorInfo:
    """The `error` object of OpenAI's shape; `type` follows `status` unless given. The
    message as `public_text` makes it (the full one is logged when that changes it)."""
    public = public_text(message)
    if public != message:
        logger.warning("error answered as %r; in full: %s", public, message)
    return ErrorInfo(
        message=_printable(public),
        type=type or ("invalid_request_error" if status < 500 else "server_error"),
        param=_printable(param) if param is not None else None,
        code=code,
    )


def public_text(text: str) -> str:
    """`text` fit for a client: no memory address (`<function f at 0x7f...>` becomes
    `<function f>`), and of a traceback (Python's, or faulthandler's dump) only its last
    line, the exception, after what came before it."""
    trace = _TRACE_START.search(text)
    if trace is not None:
        lines = text[trace.start() :].splitlines()
        last = [line for line in lines if line.strip() and not line[0].isspace()][-1:]
        before = text[: trace.start()].strip()
        exception = last[0].strip() if last and not _TRACE_START.match(last[0]) else ""
        text = " ".join(part for part in (before, exception) if part) + " (details: server log)"
    return _BARE_ADDRESS.sub("<address>", _AT_ADDRESS.sub("", text))


def _printable(text: str) -> str:
    """Text that encodes as UTF-8 (a request's lone surrogates, echoed, would not)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def describe_validation_errors(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """(message, param) for pydantic's errors: each error as "path: what", the param being
    the top-level field of the first one."""
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return f"invalid JSON in the request body: {detail or first.get('msg')}", None
    if first.get("type") == "value_error":  # our validators' "field: what is wrong"
        message = str(first.get("msg", "")).removeprefix("Value error, ")
        match = _FIELD_PATH.match(message)
        return message, match.group(1) if match else None
    parts = []
    for err in errors[:4]:
        path = _path(err.get("loc", ()))
        kind = err.get("type")
        if kind == "extra_forbidden":
            what = "unknown field: this server does not support it"
        elif kind == "missing":
            what = "required field is missing"
        else:
            what = str(err.get("msg", "invalid value"))
        parts.append(f"{path or 'body'}: {what}")
    if len(errors) > 4:
        parts.append(f"and {len(errors) - 4} more")
    loc = [p for p in first.get("loc", ()) if p != "body"]
    param = str(loc[0]) if loc and isinstance(loc[0], str) else None
    return "; ".join(parts), param


def _path(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        if part == "body":
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in str(part) or str(part) in _TYPE_TAGS or str(part).startswith("function-"):
            continue  # a union member's tag, not a field
        else:
            out += f".{part}" if out else str(part)
    return out


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error in OpenAI's shape: 400 for invalid bodies, the status of any
    HTTP error (404 unknown route, 405 method), 500 (logged) for a failure of ours."""

    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(EngineDeadError)
    async def _engine_dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        return error_response(str(exc), HTTPStatus.SERVICE_UNAVAILABLE)

    @app.exception_handler(ClientDisconnected)
    async def _client_gone(_: Request, exc: ClientDisconnected) -> Response:
        return Response(status_code=499)  # nginx's "client closed request"; never sent

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = describe_validation_errors(exc.errors())
        return error_response(message, HTTPStatus.BAD_REQUEST, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        response = error_response(str(exc.detail), exc.status_code)
        for key, value in (exc.headers or {}).items():
            response.headers[key] = value
        return response

    @app.exception_handler(Exception)
    async def _internal_error(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error", exc_info=exc)
        return error_response(f"internal server error: {type(exc).__name__}", 500)
