"""The tokens a request's own parameters ban from its output: any token outside ``allowed_token_ids``, the last
token of a ``bad_words`` sequence whose rest the output ends with, and EOS and stop tokens before ``min_tokens``.

The sampler applies these bans as -inf on the device, together with the request's grammar. Where they leave no
token at all (``allowed_token_ids=[t]`` with a bad word ``t``, or a grammar that allows only tokens the request
bans), the draw still returns a token, one that is banned. That is the request's own error, not the engine's.
The scheduler checks each sampled token here and fails such a request with an error that names the
parameters."""

from __future__ import annotations

from raygrid.engine.request import Request


def breaks_bans(req: Request, token_id: int) -> bool:
    """Whether ``token_id``, just appended to ``req``'s output, is one its parameters ban. (The scheduler asks only
    for requests whose ``bans_tokens`` is set.)"""
    params = req.sampling_params
    if req.allowed_token_set is not None and token_id not in req.allowed_token_set:
        return True
    before = req.num_output_tokens - 1  # outputs before this token
    if before < params.min_tokens and (token_id in params.stop_token_ids
                                       or (not params.ignore_eos and token_id in req.eos_token_ids)):
        return True
    outputs = req.output_token_ids
    return any(len(seq) <= len(outputs) and outputs[-len(seq):] == seq for seq in params.bad_words_token_ids)


def banning_fields(req: Request) -> list[str]:
    """The parameters that ban tokens at ``req``'s newest output position."""
    params = req.sampling_params
    return [name for name, given in (("allowed_token_ids", params.allowed_token_ids is not None),
                                     ("bad_words", bool(params.bad_words_token_ids)),
                                     ("min_tokens", req.num_output_tokens <= params.min_tokens)) if given]


def no_token_left(req: Request, grammar: bool) -> str:
    """The error of a request whose newest token had to be drawn from banned ones alone."""
    fields = " and ".join(banning_fields(req))
    what = f"the grammar allows none of the tokens that {fields} leave" if grammar else f"{fields} ban every token"
    return f"no token was left to sample at output token {req.num_output_tokens}: {what}"


def completed_too_early(req: Request) -> str | None:
    """The error of a request whose grammar completed before its ``min_tokens`` (only EOS may follow a completed
    grammar, so the output cannot reach min_tokens); None where the request may end here."""
    min_tokens = req.sampling_params.min_tokens
    if req.num_output_tokens >= min_tokens:
        return None
    return (f"the grammar completed at output token {req.num_output_tokens}, before min_tokens ({min_tokens}): only EOS "
            "may follow a completed grammar, so the output cannot reach min_tokens")
