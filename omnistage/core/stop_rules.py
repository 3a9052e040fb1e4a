"""When a sequence stops: its end-of-sequence token, a stop token, or its length.

`append_and_check_stop` appends a step's sampled tokens to a request one by
one and stops at the first that ends it (later ones, e.g. accepted drafts past
a stop token, are dropped). Stop strings are text and live in the frontend's
detokenizer, not here.
"""

from __future__ import annotations

from omnistage.core.request import Request, RequestStatus


def append_and_check_stop(request: Request, sampled: list[int], max_model_len: int) -> list[int]:
    """Append `sampled` until one ends the request (its status set); the tokens taken."""
    new_tokens: list[int] = []
    for token in sampled:
        request.append_output_token(token)
        new_tokens.append(token)
        status = stop_status(request, token, max_model_len)
        if status is not None:
            request.status = status
            break
    return new_tokens


def stop_status(request: Request, token: int, max_model_len: int) -> RequestStatus | None:
    """The finished status `token` (just appended) gives the request, or None."""
    params = request.sampling_params
    if request.num_output_tokens >= params.min_tokens:
        if token == request.eos_token_id and not params.ignore_eos:
            return RequestStatus.FINISHED_STOPPED
        if params.stop_token_ids and token in params.stop_token_ids:
            request.stop_reason = token
            return RequestStatus.FINISHED_STOPPED
    if request.num_output_tokens >= request.max_tokens or request.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None
