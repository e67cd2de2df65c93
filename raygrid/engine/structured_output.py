"""Structured outputs: a grammar (JSON schema, regex, a choice of strings, a Lark or GBNF grammar) limits
which tokens a request may sample, through llguidance.

Why llguidance: one abi3 wheel with no dependencies serves CPU and GPU alike (its masks are computed on
the host and applied by a small kernel), it builds a grammar's matcher lazily in about a millisecond instead
of precomputing every token's fate, and every compile and mask step runs on bounded "fuel"
(``LLParserLimits``), so a hostile schema fails fast instead of stalling a worker. xgrammar needs triton,
tvm-ffi and transformers pinned beside it, and compiles eagerly.

The flow, per request:
1. ``GrammarCompiler.submit`` builds the request's matcher off the step loop, on a small thread pool. The
   input processor compiles the same spec first (``check``, cached by spec) so that a bad or oversized grammar
   is a 400 before the engine sees it. Each request gets a matcher of its own, not a copy of a shared one:
   copies share their lexer behind a lock, and their masks could not be filled in parallel.
2. The scheduler admits the request once its matcher is ready. Each step, the rows of the requests that
   sample get a bitmask of allowed tokens, filled for the batch on llguidance's threads into pinned host
   memory while the device runs the step's forward pass (``GrammarThread``).
3. The worker applies the bitmask to those rows' logits before anything else in the sampler
   (``kernels.ops.apply_token_bitmask``).
4. Every sampled token advances the request's matcher, on the same thread; when the grammar is complete the
   request finishes with "stop".
"""

from __future__ import annotations

import copy
import json
import logging
import os
import sys
import threading
import weakref
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor, TimeoutError as FutureTimeout
from dataclasses import dataclass

import numpy as np

from raygrid.engine.sampling_params import StructuredOutputsParams

logger = logging.getLogger(__name__)

MAX_SPEC_BYTES = 64 * 1024  # a schema, regex or grammar longer than this is refused
COMPILE_TIME_LIMIT_S = 10.0  # the input processor's wait for a compile; llguidance's fuel bounds the work itself


# The step loop's thread runs Python for milliseconds at a time, and the grammar thread needs the GIL back between
# llguidance's calls (after advancing the matchers, after filling the masks). At CPython's default switch interval
# (5 ms) each of those waits may last a whole interval. In one A/B command on an H200, the 0.6B's decode step with
# 256 requests under a JSON schema took 7.2 ms at 5 ms against 5.9 ms unconstrained (+22%), and 6.15 ms (+4.4%) at
# 0.2 ms, the unconstrained step unchanged; how much of that holds across machines is not settled yet
# (benchmarks/README.md, "The GIL switch interval"). So while a grammar thread lives, its process switches at 0.2 ms.
# RAYGRID_GRAMMAR_SWITCH_INTERVAL_S sets another value; 0 leaves the interpreter's.
GRAMMAR_SWITCH_INTERVAL_S = float(os.environ.get("RAYGRID_GRAMMAR_SWITCH_INTERVAL_S", "0.0002"))


def grammar_threads() -> int | None:
    """How many threads llguidance advances the matchers and fills a step's masks on: RAYGRID_GRAMMAR_THREADS,
    or None for llguidance's default (80% of the CPUs, at most 32)."""
    value = os.environ.get("RAYGRID_GRAMMAR_THREADS", "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"RAYGRID_GRAMMAR_THREADS must be a whole number of at least 1, not {value!r}")
    return int(value)


# Read once, when the engine starts (its import of this module): a bad value stops the start, naming the variable.
GRAMMAR_THREADS = grammar_threads()


class _SwitchInterval:
    """The process's GIL switch interval, shortened while any grammar thread lives (counted: engines may share
    a process, as the DP ranks of one world do); the last one to go restores the value it found."""

    _lock = threading.Lock()
    _holders = 0
    _saved = 0.0

    @classmethod
    def hold(cls) -> None:
        with cls._lock:
            if cls._holders == 0:
                cls._saved = sys.getswitchinterval()
                sys.setswitchinterval(GRAMMAR_SWITCH_INTERVAL_S)
            cls._holders += 1

    @classmethod
    def release(cls) -> None:
        with cls._lock:
            cls._holders -= 1
            if cls._holders == 0:
                sys.setswitchinterval(cls._saved)


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
            schema = json.loads(spec)
            if kind == "json":
                schema = closed_objects(schema)
            # Compact JSON: no free whitespace, which a model could otherwise emit forever.
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
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


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # name -> schema
_SCHEMA_DATA = ("enum", "const", "default", "examples")  # values, not schemas


def closed_objects(schema):
    """The schema with ``additionalProperties: false`` on every object that lists its properties and says
    nothing of others, as vLLM's default grammar backend (xgrammar, in its strict mode) reads schemas: a pydantic
    model's schema then admits exactly its fields, instead of letting a model add keys without end."""
    if isinstance(schema, list):
        return [closed_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            closed[key] = {name: closed_objects(sub) for name, sub in value.items()}
        else:
            closed[key] = value if key in _SCHEMA_DATA else closed_objects(value)
    if "properties" in schema and not {"additionalProperties", "unevaluatedProperties", "patternProperties"} & schema.keys():
        closed["additionalProperties"] = False
    return closed


class GrammarCompiler:
    """Compiles structured-outputs specs into llguidance matchers for one tokenizer, on a small thread pool.
    A spec is checked once (a cache by spec keeps its grammar); each request's matcher is built from it.
    Thread-safe.

    llguidance builds its tokenizer from the Rust tokenizer's JSON as transformers loads it (with the tokens that
    tokenizer_config.json adds). A compiler pickles with that JSON, so a process that receives one (a Ray replica's
    driver) builds the same tokenizer without importing transformers and torch: for the tests' tokenizer 0.1 s
    against about 3 s on CI's machine, which on the GIL of a step loop that spun meanwhile took several times as long."""

    def __init__(self, tokenizer_path: str, vocab_size: int, eos_token_ids: frozenset[int] | list[int],
                 max_workers: int = 2, cache_size: int = 256, hf_tokenizer=None,
                 tokenizer_json: str | GrammarError | None = None) -> None:
        """``hf_tokenizer``: the caller's transformers tokenizer of ``tokenizer_path``, if it has one loaded;
        ``tokenizer_json``: its Rust tokenizer's JSON, or why it has none (what a pickled compiler carries)."""
        self.tokenizer_path = tokenizer_path
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self._max_workers = max_workers
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="raygrid-grammar")
        self._cache: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()  # the cache
        self._tokenizer_lock = threading.Lock()  # held while the tokenizer builds (about a second), not by submit()
        self._tokenizer = None
        self._hf_tokenizer = hf_tokenizer
        self._tokenizer_json = tokenizer_json

    def __reduce__(self):
        try:
            carried: str | GrammarError = self.tokenizer_json()
        except GrammarError as error:  # a slow tokenizer: the copy refuses grammars as this compiler does
            carried = error
        return GrammarCompiler, (self.tokenizer_path, self.vocab_size, self.eos_token_ids, self._max_workers,
                                 self._cache_size, None, carried)

    def tokenizer_json(self) -> str:
        """The Rust tokenizer's JSON as transformers loads it, padding and truncation off (as llguidance's
        ``hf.from_tokenizer`` takes it)."""
        with self._tokenizer_lock:
            if self._tokenizer_json is None:
                hf = self._hf_tokenizer
                if hf is None:
                    from transformers import AutoTokenizer

                    hf = AutoTokenizer.from_pretrained(self.tokenizer_path)
                backend = getattr(hf, "backend_tokenizer", None)
                if backend is None:
                    self._tokenizer_json = GrammarError(f"structured_outputs: the tokenizer of {self.tokenizer_path!r} "
                                                        "is not a fast (Rust) tokenizer, which llguidance needs")
                else:
                    if backend.padding is not None or backend.truncation is not None:
                        backend = copy.copy(backend)  # a copy through JSON: 4x the cost of to_str() at 151,936 ids
                        backend.no_padding()
                        backend.no_truncation()
                    self._tokenizer_json = backend.to_str()
            if isinstance(self._tokenizer_json, GrammarError):
                raise GrammarError(str(self._tokenizer_json))
            return self._tokenizer_json

    @property
    def tokenizer(self):
        """llguidance's view of the tokenizer, padded to the model's vocabulary (built once, on first use)."""
        tokenizer_json = self.tokenizer_json()
        with self._tokenizer_lock:
            if self._tokenizer is None:
                import llguidance

                self._tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=self.vocab_size,
                                                         eos_token=self.eos_token_ids or None)
            return self._tokenizer

    def submit(self, params: StructuredOutputsParams) -> Future:
        """A Future of a new matcher for ``params``, built once the spec has been checked (a matcher holds
        one request's progress)."""
        checked = self._compiled(params)
        built: Future = Future()

        def build(grammar: str) -> None:
            import llguidance

            try:
                built.set_result(llguidance.LLMatcher(self.tokenizer, grammar, log_level=0))
            except BaseException as error:  # noqa: BLE001 - the request fails with it, the pool carries on
                built.set_exception(error)

        def then(done: Future) -> None:
            error = done.exception()
            if error is not None:
                built.set_exception(error)
            else:
                try:
                    self._pool.submit(build, done.result())
                except RuntimeError as shut:  # the engine is shutting down
                    built.set_exception(shut)

        checked.add_done_callback(then)
        return built

    def check(self, params: StructuredOutputsParams, time_limit_s: float = COMPILE_TIME_LIMIT_S) -> None:
        """Raise GrammarError (naming the field and the limit) unless ``params`` compiles within the limit."""
        try:
            self._compiled(params).result(timeout=time_limit_s)
        except FutureTimeout:
            raise GrammarError(f"structured_outputs.{params.kind_and_spec()[0]} did not compile within "
                               f"{time_limit_s:g} s") from None

    def _compiled(self, params: StructuredOutputsParams) -> Future:
        """The cached check of ``params`` (started now if it is not cached): a Future of its grammar."""
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
            raise GrammarError(f"structured_outputs.{kind} does not compile: {grammar_error_line(matcher.get_error())}")
        return grammar

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def grammar_error_line(message: str) -> str:
    """llguidance's error in one line: its first, with the reason a regex parse error prints further down
    ("... regex parse error: unclosed group")."""
    lines = [line.strip() for line in message.strip().splitlines()]
    if not lines:
        return message
    reason = next((line.removeprefix("error:").strip() for line in lines[1:] if line.startswith("error:")), None)
    return f"{lines[0]} {reason}" if reason and lines[0].endswith(":") else lines[0]


@dataclass(frozen=True)
class GrammarVerdict:
    """What a request's grammar made of its tokens: ``index`` is the token it completed on, or refused
    (``refused`` is that token's id, and ``error`` llguidance's reason)."""

    index: int
    refused: int | None = None
    error: str | None = None


class GrammarThread:
    """The per-step grammar work of the batch, on one thread of its own and in the order it is queued: the
    sampled tokens advance the matchers (``advance``), then the next step's bitmasks of allowed tokens fill
    (``fill``). llguidance spreads both over its threads and drops the GIL meanwhile. Where a GPU in this
    process reads them, the masks go into pinned host memory, which the device copies from without staging.
    Three buffers take turns: a step's buffer is reused three fills later, when its copy to the device has long
    been done (the engine waits for each step's tokens before the grammars advance for the next fill). While it
    lives, the process's GIL switch interval is GRAMMAR_SWITCH_INTERVAL_S, so that this thread gets the GIL back
    soon after each of llguidance's calls."""

    RING = 3

    def __init__(self, vocab_size: int, max_rows: int, pinned: bool = False) -> None:
        """``pinned``: page-locked buffers (only where a GPU in this process copies them: pinning opens a
        CUDA context, which a Ray driver must not do on a GPU its workers use)."""
        import llguidance

        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._executor = llguidance.LLExecutor(num_threads=GRAMMAR_THREADS)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raygrid-grammar-step")
        if pinned:
            import torch  # only here: a Ray driver, whose masks are pickled, has no need of torch

            # Each array keeps its tensor, and so the page-locked memory, alive.
            self._buffers = [torch.empty((max_rows, self.words), dtype=torch.int32, pin_memory=True).numpy()
                             for _ in range(self.RING)]
        else:
            self._buffers = [np.empty((max_rows, self.words), dtype=np.int32) for _ in range(self.RING)]
        self._turn = 0
        self._switch_interval = None
        if GRAMMAR_SWITCH_INTERVAL_S > 0:  # released by shutdown, or when this object is collected
            _SwitchInterval.hold()
            self._switch_interval = weakref.finalize(self, _SwitchInterval.release)

    def advance(self, items: list[tuple[str, object, list[int]]]) -> Future:
        """``(request id, matcher, sampled tokens)`` each: a Future of ``{request id: GrammarVerdict}`` for the
        requests whose grammar completed or refused a token (a matcher stops at that token)."""
        return self._thread.submit(self._advance, items)

    def fill(self, matchers: list) -> Future:
        """A Future of the ``[len(matchers), ceil(vocab / 32)]`` int32 masks, filled after everything queued
        before: bit t % 32 of word t // 32 of row i is set when matcher i allows token t."""
        if len(matchers) > self._buffers[0].shape[0]:
            raise ValueError(f"{len(matchers)} grammar rows in a step; the bitmask buffers hold {self._buffers[0].shape[0]}")
        bitmask = self._buffers[self._turn][: len(matchers)]
        self._turn = (self._turn + 1) % self.RING
        return self._thread.submit(self._fill, matchers, bitmask)

    def _advance(self, items: list[tuple[str, object, list[int]]]) -> dict[str, GrammarVerdict]:
        accepted = self._executor.consume_token_par([(matcher, tokens[0]) for _, matcher, tokens in items])
        verdicts = {}
        for (req_id, matcher, tokens), ok in zip(items, accepted):
            for index, token in enumerate(tokens):
                if index and not matcher.consume_token(token):  # a step of several tokens (rare): one at a time
                    ok = False
                if not ok:
                    verdicts[req_id] = GrammarVerdict(index, token, grammar_error_line(matcher.get_error()))
                    break
                if matcher.is_stopped():
                    verdicts[req_id] = GrammarVerdict(index)
                    break
        return verdicts

    def _fill(self, matchers: list, bitmask: np.ndarray) -> np.ndarray:
        from llguidance.numpy import fill_next_token_bitmask_par

        fill_next_token_bitmask_par(self._executor, [(m, i) for i, m in enumerate(matchers)], bitmask)
        return bitmask

    def shutdown(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
        if self._switch_interval is not None:
            self._switch_interval()  # once, however often shutdown is called
