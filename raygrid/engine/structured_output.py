"""Structured outputs: a grammar (JSON schema, regex, a choice of strings, a Lark or GBNF grammar) limits
which tokens a request may sample, through llguidance.

Why llguidance: one abi3 wheel with no dependencies serves CPU and GPU alike (its masks are computed on
the host and applied by a torch op), it builds a grammar's matcher lazily in about a millisecond instead of
precomputing every token's fate, and every compile and mask step runs on bounded "fuel" (``LLParserLimits``),
so a hostile schema fails fast instead of stalling a worker. xgrammar needs triton, tvm-ffi and
transformers pinned beside it, and compiles eagerly.

The flow, per request:
1. ``GrammarCompiler.submit`` compiles off the step loop (a thread pool: llguidance drops the GIL), with a
   cache of compiled matchers by spec; each request gets its own copy. The input processor compiles the
   same spec first (``check``) so that a bad or oversized grammar is a 400 before the engine sees it.
2. The scheduler admits the request once its matcher is ready. Each step, the rows of the requests that
   sample get a bitmask of allowed tokens (``fill_bitmask``), filled for the batch in parallel.
3. The worker applies the bitmask to those rows' logits before anything else in the sampler
   (``apply_bitmask``).
4. Every sampled token advances the request's matcher (``accept``); when the grammar is complete the request
   finishes with "stop".
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor, TimeoutError as FutureTimeout

import numpy as np
import torch

from raygrid.engine.sampling_params import StructuredOutputsParams

logger = logging.getLogger(__name__)

MAX_SPEC_BYTES = 64 * 1024  # a schema, regex or grammar longer than this is refused
COMPILE_TIME_LIMIT_S = 10.0  # the input processor's wait for a compile; llguidance's fuel bounds the work itself


class GrammarError(ValueError):
    """A structured-outputs spec that does not compile, or that is over a limit."""


def grammar_for(params: StructuredOutputsParams) -> str:
    """The llguidance grammar of ``params`` (not yet checked: the matcher does that)."""
    import llguidance

    kind, spec = params.kind_and_spec()
    if len(spec.encode()) > MAX_SPEC_BYTES:
        raise GrammarError(f"structured_outputs.{kind} is {len(spec.encode())} bytes; the limit is {MAX_SPEC_BYTES}")
    if kind in ("json", "json_object"):
        try:
            # Compact JSON: no free whitespace, which a model could otherwise emit forever.
            return llguidance.LLMatcher.grammar_from_json_schema(spec, defaults={"whitespace_flexible": False})
        except ValueError as error:
            raise GrammarError(f"structured_outputs.{kind}: {error}") from None
    if kind == "choice":
        return llguidance.grammar_from("choice", spec)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec)
    try:
        return llguidance.grammar_from("grammar", spec)  # Lark, or GBNF (converted)
    except ValueError as error:
        raise GrammarError(f"structured_outputs.grammar: {error}") from None


class GrammarCompiler:
    """Compiles structured-outputs specs into llguidance matchers for one tokenizer, on a small thread pool,
    with a cache by spec. Thread-safe."""

    def __init__(self, tokenizer_path: str, vocab_size: int, eos_token_ids: frozenset[int] | list[int],
                 max_workers: int = 2, cache_size: int = 256) -> None:
        self.tokenizer_path = tokenizer_path
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="raygrid-grammar")
        self._cache: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()  # the cache
        self._tokenizer_lock = threading.Lock()  # held while the tokenizer builds (about a second), not by submit()
        self._tokenizer = None

    @property
    def tokenizer(self):
        """llguidance's view of the tokenizer, padded to the model's vocabulary (built once, on first use)."""
        with self._tokenizer_lock:
            if self._tokenizer is None:
                import llguidance.hf
                from transformers import AutoTokenizer

                hf = AutoTokenizer.from_pretrained(self.tokenizer_path)
                self._tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=self.vocab_size,
                                                               eos_token=self.eos_token_ids or None)
            return self._tokenizer

    def submit(self, params: StructuredOutputsParams) -> Future:
        """A Future of a fresh matcher for ``params`` (its own copy: matchers hold a request's progress)."""
        compiled = self._compiled(params)
        copied: Future = Future()

        def copy(done: Future) -> None:
            error = done.exception()
            if error is not None:
                copied.set_exception(error)
            else:
                copied.set_result(done.result().deep_copy())

        compiled.add_done_callback(copy)
        return copied

    def check(self, params: StructuredOutputsParams, time_limit_s: float = COMPILE_TIME_LIMIT_S) -> None:
        """Raise GrammarError (naming the field and the limit) unless ``params`` compiles within the limit."""
        try:
            self._compiled(params).result(timeout=time_limit_s)
        except FutureTimeout:
            raise GrammarError(f"structured_outputs.{params.kind_and_spec()[0]} did not compile within "
                               f"{time_limit_s:g} s") from None

    def _compiled(self, params: StructuredOutputsParams) -> Future:
        """The cached compile of ``params`` (started now if it is not cached): a Future of the shared matcher."""
        key = params.kind_and_spec()
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is None:
                compiled = self._pool.submit(self._compile, params)
                self._cache[key] = compiled
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
        return compiled

    def _compile(self, params: StructuredOutputsParams):
        import llguidance

        grammar = grammar_for(params)
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            kind = params.kind_and_spec()[0]
            raise GrammarError(f"structured_outputs.{kind} does not compile: {first_line(matcher.get_error())}")
        return matcher

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else message


class GrammarBitmasks:
    """The host side of each step: bitmasks of allowed tokens for the rows that sample, filled for the batch
    at once on llguidance's threads."""

    def __init__(self, vocab_size: int) -> None:
        import llguidance

        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._executor = llguidance.LLExecutor()

    def fill(self, matchers: list) -> np.ndarray:
        """``[len(matchers), ceil(vocab / 32)]`` int32: bit t of row i set when matcher i allows token t."""
        from llguidance.numpy import fill_next_token_bitmask_par

        bitmask = np.empty((len(matchers), self.words), dtype=np.int32)
        fill_next_token_bitmask_par(self._executor, [(m, i) for i, m in enumerate(matchers)], bitmask)
        return bitmask


def accept(matcher, token_id: int) -> tuple[bool, bool]:
    """Feed a sampled token to a request's matcher: (accepted, grammar complete)."""
    ok = matcher.consume_token(token_id)
    return ok, ok and matcher.is_stopped()


def apply_bitmask(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set to -inf the logits of ``rows`` whose token is not allowed by that row's bitmask (int32 words,
    bit t % 32 of word t // 32), in place."""
    vocab = logits.shape[1]
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, :vocab]
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))

