"""Request migration: what a front end over several engine replicas keeps of each request it handed out, so
that the request can continue on another replica when its own fails (NVIDIA Dynamo's approach).

A request continues as its prompt plus the tokens the front end has received (``Progress.resumed``). The new
replica computes their KV again (from its prefix cache where it can) and samples the next token: its
scheduler counts the received tokens as output already made, so ``max_tokens``, ``min_tokens``, the penalties
and the position-keyed noise of a seeded request carry on where they were, a grammar is advanced over them
before the first new token, and prompt logprobs already sent are not sent again. The request keeps its id, so
the front end's detokenizer, stop strings and ``n > 1`` children carry on untouched: no token is lost (the
front end never saw those of the failed replica's unfinished steps) or repeated.

Used by the Ray front end (cluster/ray_engine.py) and the Serve application's client (serve/engine_client.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from raygrid.engine.outputs import EngineCoreOutput
from raygrid.engine.request import Request


def past_limit(failure: str, max_migrations: int) -> str:
    """The error of a request whose replica failed after it had moved ``max_migrations`` times already."""
    if max_migrations == 0:
        return failure
    return f"{failure} (the request had moved {max_migrations} time(s): max_migrations is {max_migrations})"


@dataclass
class Progress:
    """One request as first sent, and what came back of it so far."""

    request: Request
    output_token_ids: list[int] = field(default_factory=list)
    num_prompt_logprobs: int = 0  # prompt logprob entries received (for prompt tokens 1, 2, ...)
    num_cached_tokens: int = -1  # as the first replica reported it (-1: no output yet)
    migrations: int = 0
    cause: str | None = None  # the failure it last moved from

    def record(self, out: EngineCoreOutput) -> None:
        self.output_token_ids.extend(out.new_token_ids)
        self.num_prompt_logprobs += len(out.new_prompt_logprobs)
        if self.num_cached_tokens < 0 and (out.new_token_ids or out.new_prompt_logprobs):
            self.num_cached_tokens = out.num_cached_tokens

    def migrate(self, max_migrations: int) -> Request | None:
        """Count a move and return the request for the next replica; None once it has moved ``max_migrations`` times."""
        if self.migrations >= max_migrations:
            return None
        self.migrations += 1
        return self.resumed()

    def resumed(self) -> Request:
        """The request to send to the next replica: the prompt, and the tokens received as output so far."""
        first = self.request
        request = Request(first.request_id, first.prompt_token_ids, first.sampling_params, first.max_tokens,
                          first.eos_token_ids, arrival_time=first.arrival_time, priority=first.priority,
                          cache_salt=first.cache_salt)
        request.output_token_ids = list(self.output_token_ids)
        request.all_token_ids = request.prompt_token_ids + request.output_token_ids
        # The prompt's entries go out once: those received are not sent again.
        request.num_prompt_logprobs_sent = self.num_prompt_logprobs + 1 if self.num_prompt_logprobs else 0
        # Scheduled before: its queue time and cached-token count went out with its first output already.
        request.num_cached_tokens = self.num_cached_tokens
        return request


class RequestLedger:
    """The unfinished requests a front end handed to engine replicas, and their progress."""

    def __init__(self, max_migrations: int) -> None:
        self.max_migrations = max_migrations
        self._progress: dict[str, Progress] = {}

    def add(self, request: Request) -> None:
        self._progress[request.request_id] = Progress(request)

    def record(self, outputs: Iterable[EngineCoreOutput]) -> None:
        """Note what the front end received; a finished request is forgotten."""
        for out in outputs:
            progress = self._progress.get(out.req_id)
            if progress is None:
                continue
            if out.finished:
                del self._progress[out.req_id]
            else:
                progress.record(out)

    def forget(self, request_id: str) -> None:
        self._progress.pop(request_id, None)

    def migrate(self, request_id: str, cause: str) -> Request | None:
        """The request to run elsewhere after its replica failed with ``cause``, or None when it has used up
        its ``max_migrations`` (it is then forgotten: the caller fails it)."""
        progress = self._progress.get(request_id)
        resumed = progress.migrate(self.max_migrations) if progress is not None else None
        if resumed is None:
            self._progress.pop(request_id, None)
        else:
            progress.cause = cause
        return resumed

    def cause(self, request_id: str) -> str | None:
        """The failure the request last moved from (None: it has not moved)."""
        progress = self._progress.get(request_id)
        return progress.cause if progress is not None else None

    def migrations(self, request_id: str) -> int:
        progress = self._progress.get(request_id)
        return progress.migrations if progress is not None else 0
