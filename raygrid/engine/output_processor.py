"""Turns engine-core outputs (token ids) into user-facing RequestOutputs (text, logprobs).

Runs in the front end, beside the tokenizer. A stop string is found here, after detokenization, so
the request is then aborted in the engine core; a request with ``n > 1`` runs as n child requests
whose completions are gathered into one RequestOutput.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raygrid.engine.detokenizer import IncrementalDetokenizer
from raygrid.engine.input_processor import ProcessedRequest
from raygrid.engine.outputs import CompletionOutput, EngineCoreOutput, Logprob, RequestOutput, SampleLogprobs
from raygrid.engine.sampling_params import SamplingParams


@dataclass
class ChildState:
    index: int
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    logprobs: list[dict[int, Logprob]] | None
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_streamed_tokens: int = 0  # delta mode: tokens already handed out
    finish_streamed: bool = False
    eos_token_ids: frozenset[int] = frozenset()  # those that end it (none under ignore_eos)


@dataclass
class ParentState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    children: dict[str, ChildState] = field(default_factory=dict)
    num_cached_tokens: int = 0
    error: str | None = None
    invalid: bool = False  # the error is the request's own (EngineCoreOutput.invalid)
    # Delta mode (streaming): each output carries only what is new since the last one.
    delta: bool = False
    # prompt_logprobs: [None] and then one entry per prompt token as they come, from the first child (all
    # children share the prompt).
    prompt_logprobs: list | None = None
    prompt_logprobs_child: str | None = None

    num_unfinished: int = 0  # children still running

    @property
    def finished(self) -> bool:
        return self.num_unfinished == 0


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.parents: dict[str, ParentState] = {}
        self.parent_of: dict[str, str] = {}  # child request id -> parent request id

    def add_request(self, processed: ProcessedRequest, delta: bool = False) -> None:
        parent = ParentState(processed.request_id, processed.prompt, processed.prompt_token_ids, delta=delta)
        for index, child in enumerate(processed.children):
            params = child.sampling_params
            parent.children[child.request_id] = ChildState(
                index=index,
                params=params,
                detokenizer=IncrementalDetokenizer(self.tokenizer, processed.prompt_token_ids, params, lazy=not delta),
                logprobs=[] if params.logprobs is not None else None,
                eos_token_ids=frozenset() if params.ignore_eos else child.eos_token_ids,
            )
            self.parent_of[child.request_id] = processed.request_id
        parent.num_unfinished = len(parent.children)
        if processed.children and processed.children[0].sampling_params.prompt_logprobs is not None:
            parent.prompt_logprobs, parent.prompt_logprobs_child = [None], processed.children[0].request_id
        self.parents[processed.request_id] = parent

    def process(self, outputs: list[EngineCoreOutput], emit_unfinished: bool = True) -> tuple[list[RequestOutput], list[str]]:
        """Apply a step's outputs. Returns the RequestOutputs of the parents that changed (only the
        finished ones unless ``emit_unfinished``: an offline batch needs no partial results), and the
        child ids the engine core must abort because a stop string ended them."""
        changed: dict[str, ParentState] = {}
        to_abort: list[str] = []
        for out in outputs:
            parent_id = self.parent_of.get(out.req_id)
            if parent_id is None:
                continue
            parent = self.parents[parent_id]
            child = parent.children[out.req_id]
            if child.finish_reason is not None:
                # A stop string already ended it; this is a later step of the engine's, which a front end
                # that fell behind receives in the same batch (the engine had not seen the abort yet).
                continue
            parent.num_cached_tokens = max(parent.num_cached_tokens, out.num_cached_tokens)
            if out.error:
                parent.error, parent.invalid = out.error, out.invalid
            if out.new_prompt_logprobs and out.req_id == parent.prompt_logprobs_child:
                parent.prompt_logprobs.extend(self._logprob_entry(sample, True) for sample in out.new_prompt_logprobs)
            stop = child.detokenizer.update(out.new_token_ids, stop_token_last=self._ends_on_stop_token(child, out))
            self._add_logprobs(child, out.new_logprobs)
            if stop is not None:
                child.finish_reason, child.stop_reason = "stop", stop
                parent.num_unfinished -= 1
                if out.finish_reason is None:
                    to_abort.append(out.req_id)
            elif out.finish_reason is not None:
                child.finish_reason, child.stop_reason = out.finish_reason, out.stop_reason
                parent.num_unfinished -= 1
                child.detokenizer.flush()
            if emit_unfinished or parent.finished:
                changed[parent_id] = parent
        results = [self._make_output(parent) for parent in changed.values()]
        for parent in changed.values():
            if parent.finished:
                self._forget(parent)
        return results, to_abort

    @staticmethod
    def _ends_on_stop_token(child: ChildState, out: EngineCoreOutput) -> bool:
        """Whether the engine ended the request on its last new token because it is EOS or a stop token (not a
        grammar's last token)."""
        return (out.finish_reason == "stop" and bool(out.new_token_ids)
                and (isinstance(out.stop_reason, int) or out.new_token_ids[-1] in child.eos_token_ids))

    def child_ids(self, request_id: str) -> list[str]:
        """The engine-side ids of a request's children (none if it is unknown or finished)."""
        parent = self.parents.get(request_id)
        return list(parent.children) if parent is not None else []

    def abort(self, request_id: str) -> RequestOutput | None:
        """Mark a whole request aborted; returns its final output."""
        parent = self.parents.get(request_id)
        if parent is None:
            return None
        for child in parent.children.values():
            if child.finish_reason is None:
                child.finish_reason = "abort"
        parent.num_unfinished = 0
        self._forget(parent)
        return self._make_output(parent)

    def _forget(self, parent: ParentState) -> None:
        self.parents.pop(parent.request_id, None)
        for child_id in parent.children:
            self.parent_of.pop(child_id, None)

    def _add_logprobs(self, child: ChildState, new_logprobs: list[SampleLogprobs]) -> None:
        if child.logprobs is None:
            return
        for sample in new_logprobs:
            child.logprobs.append(self._logprob_entry(sample, child.params.detokenize))
            child.cumulative_logprob += sample.logprobs[0]

    def _logprob_entry(self, sample: SampleLogprobs, detokenize: bool) -> dict[int, Logprob]:
        """{token: Logprob} of one position: the chosen (sampled, or the prompt's) token and the top-k."""
        text = self._token_text if detokenize else (lambda _: None)
        entry = {sample.token_ids[0]: Logprob(sample.logprobs[0], sample.sampled_rank, text(sample.token_ids[0]))}
        for rank, (token_id, logprob) in enumerate(zip(sample.token_ids[1:], sample.logprobs[1:]), start=1):
            entry.setdefault(token_id, Logprob(logprob, rank, text(token_id)))
        return entry

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _make_output(self, parent: ParentState) -> RequestOutput:
        completions = []
        for child in parent.children.values():  # added in index order
            detok = child.detokenizer
            start = child.num_streamed_tokens if parent.delta else 0
            if parent.delta:
                if child.finish_streamed or (len(detok.token_ids) == start and child.finish_reason is None):
                    continue  # nothing new for this completion
                text = detok.stream_delta(finished=child.finish_reason is not None)
                child.num_streamed_tokens = len(detok.token_ids)
                child.finish_streamed = child.finish_reason is not None
            else:
                text = detok.output_text
            completions.append(
                CompletionOutput(
                    index=child.index,
                    text=text,
                    token_ids=detok.token_ids[start:],
                    cumulative_logprob=child.cumulative_logprob if child.logprobs is not None else None,
                    logprobs=child.logprobs[start:] if child.logprobs is not None else None,
                    finish_reason=child.finish_reason,
                    stop_reason=child.stop_reason,
                )
            )
        return RequestOutput(
            request_id=parent.request_id,
            prompt=parent.prompt,
            prompt_token_ids=parent.prompt_token_ids,
            outputs=completions,
            finished=parent.finished,
            num_cached_tokens=parent.num_cached_tokens,
            error=parent.error,
            invalid=parent.invalid,
            prompt_logprobs=list(parent.prompt_logprobs) if parent.prompt_logprobs is not None else None,
        )
