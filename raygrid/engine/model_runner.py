"""One step on one device: SchedulerOutput -> persistent batch -> tensors -> forward -> sample (its result comes
back through pending_output.py). The passes that size the KV cache are memory_profile.py's."""

from __future__ import annotations

import logging
import time
from collections import Counter
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch

from raygrid.config import EngineConfig
from raygrid.engine.cuda_graphs import CallGraph, FullGraphs, GraphBuffers, capture_sizes
from raygrid.engine.input_batch import CachedRequestState, InputBatch
from raygrid.engine.memory_profile import free_device_memory, kv_cache_shape, single_sequence_metadata, zeroed_cache
from raygrid.engine.outputs import SampleLogprobs, SchedulerOutput
from raygrid.engine.pending_output import PendingRunnerOutput
from raygrid.engine.piecewise_graphs import PiecewiseGraphs, piecewise_sizes
from raygrid.engine.sampler import Sampler, gather_logprobs
from raygrid.engine.sampling_inputs import SamplingInputs
from raygrid.engine.staging import StagingBuffers, step_fields
from raygrid.kernels import ops
from raygrid.kernels.ops import apply_token_bitmask
from raygrid.models.layers.attention import AttentionMetadata
from raygrid.parallel.eplb import Rebalancer
from raygrid.parallel.expert_parallel import PassPlan, PassPlanner
from raygrid.parallel.groups import get_pp_group

if TYPE_CHECKING:
    from raygrid.kernels.persistent_decode import PersistentDecode  # Triton: imported where a GPU runs it

logger = logging.getLogger(__name__)

_PROMPT_LOGPROB_ROWS = 512  # prompt positions whose logits one slice holds (512 x a 152k vocabulary x 4 bytes = 311 MB)
MIXED_MAX_TOKENS = 2048  # the largest mixed graph (one launch a step); longer steps replay the piecewise graphs


class ModelRunner:
    def __init__(self, config: EngineConfig, model: torch.nn.Module, device: torch.device, dtype: torch.dtype, eos_token_ids: frozenset[int]) -> None:
        self.config = config
        self.model = model
        self.device = device
        self.dtype = dtype
        self.triton = ops.use_triton(torch.empty(0, device=device))  # the GPU's kernels, not the torch references
        self.pp = get_pp_group()
        self.block_size = config.cache.block_size
        self.kv_dtype = dtype if config.cache.cache_dtype == "auto" else torch.float8_e4m3fn
        self.vocab_size = model.config.vocab_size
        max_len = config.model.max_model_len
        self.max_blocks_per_req = -(-max_len // self.block_size)
        self.batch = InputBatch(config.scheduler.max_num_seqs, max_len, self.max_blocks_per_req, eos_token_ids)
        self.requests: dict[str, CachedRequestState] = {}
        self.sampler = Sampler()
        self.kv_caches: list[torch.Tensor] = []
        self.graphs: FullGraphs | None = None  # decode steps, and steps with prefill over many requests
        self.piecewise: PiecewiseGraphs | None = None  # steps with prefill (none under expert parallelism)
        self.graph_memory_bytes = 0  # device memory the CUDA graphs hold, once captured
        # kernels.persistent_decode.PersistentDecode by rows: the decode passes of a few requests, each in one launch;
        # each launch captured where the runner uses CUDA graphs; and the passes each took.
        self.persistent: dict[int, PersistentDecode] = {}
        self.persistent_graphs: dict[int, CallGraph] = {}
        self.persistent_passes: Counter[int] = Counter()
        # Requests this worker refused (until the scheduler reports them finished), and why.
        self.rejected: dict[str, str] = {}
        self._copy_stream: torch.cuda.Stream | None = None  # grammar masks go to the device on it
        self.prev_sampled: torch.Tensor | None = None
        self.prev_sampled_index: dict[str, int] = {}
        max_reqs = config.scheduler.max_num_seqs
        self._row_numbers = np.arange(max_reqs)
        max_tokens = max(config.scheduler.max_num_batched_tokens, max_reqs)  # a decode graph's rows too
        self.staging = StagingBuffers(device, step_fields(max_tokens, max_reqs, self.max_blocks_per_req))
        self.sampling_inputs = SamplingInputs(self.staging, device, self.vocab_size, config.model.seed, max_reqs)
        # Expert parallelism: every DP rank of the world runs a forward pass each step (a dummy one when it has
        # nothing to run), and with EPLB the experts are rebalanced every step_interval passes.
        self.passes = PassPlanner(self.max_graph_batch, device, self.uses_cuda_graphs)
        self.expert_parallel = self.passes.expert_parallel
        self.rebalancer = Rebalancer.for_model(model, config.parallel.eplb_config) if config.parallel.enable_eplb else None
        self._eplb_report = None

    def forward(self, plan: PassPlan, input_ids, positions, meta, intermediate, kv_caches=None):
        if plan.graph_size is not None:
            return self.graphs.run(plan.graph_size, input_ids, positions, meta, intermediate)
        if plan.mixed_size is not None:
            return self.graphs.run_mixed(plan.mixed_size, input_ids, positions, meta, intermediate)
        if plan.piecewise_size is not None:
            return self.piecewise.run(plan.piecewise_size, input_ids, positions, meta, intermediate)
        with plan.context():
            return self.model(input_ids, positions, self.kv_caches if kv_caches is None else kv_caches, meta, intermediate)

    def _after_forward(self) -> None:
        if self.rebalancer is not None:
            report = self.rebalancer.step()
            if report is not None:
                self._eplb_report = report  # goes out with the next real step's output

    @torch.inference_mode()
    def _dummy_step(self) -> None:
        """Expert parallelism with nothing to run: this rank still takes part in the layers' collectives (the
        other DP ranks' tokens go through them), replaying a graph of padding rows alone, or eagerly a pass of one
        token whose KV goes to the null block."""
        plan = self.passes.plan(self.graphs, 1, 0)
        if plan.graph_size is not None:  # every stage of this DP rank replays padding: nothing to hand over
            empty = torch.zeros(0, dtype=torch.long, device=self.device)
            blocks = torch.zeros(0, 1, dtype=torch.int32, device=self.device)
            intermediate = None if self.pp.is_first else tuple(torch.zeros(0, self.model.config.hidden_size, dtype=self.dtype, device=self.device)
                                                               for _ in range(2))
            meta = AttentionMetadata(slot_mapping=empty, block_tables=blocks, seq_lens=[], query_start_loc=[], max_query_len=1,
                                     seq_lens_tensor=blocks[:, 0], query_start_loc_tensor=blocks[:, 0])
            self.forward(plan, empty, empty, meta, intermediate)
        else:
            ids = torch.zeros(1, dtype=torch.long, device=self.device)
            meta = single_sequence_metadata(1, self.block_size, self.device, first_block=0)
            intermediate = None
            if not self.pp.is_first:
                shape = (1, self.model.config.hidden_size)
                intermediate = tuple(self.pp.recv([shape, shape], self.dtype, self.device, src=self.pp.rank_in_group - 1))
            hidden = self.forward(plan, ids, ids.clone(), meta, intermediate)
            if not self.pp.is_last:
                self.pp.send(list(hidden), dst=self.pp.rank_in_group + 1)
        self._after_forward()

    @property
    def uses_cuda_graphs(self) -> bool:
        return self.device.type == "cuda" and not self.config.model.enforce_eager

    def capture_graphs(self, kv_caches: list[torch.Tensor], largest_only: bool = False) -> tuple[FullGraphs, PiecewiseGraphs | None]:
        """The full graphs (decode, and without expert parallelism mixed) and the piecewise graphs of steps with
        prefill, all in one memory pool; ``largest_only``: each kind's largest size alone, which sizes the pool."""
        stage_input = None if self.pp.is_first else (self.model.config.hidden_size, self.dtype)
        decode, mixed, pieces = self.graph_sizes()
        if largest_only:
            decode, mixed, pieces = decode[-1:], mixed[-1:], pieces[-1:]
        max_tokens = max([self.max_graph_batch, *mixed, *pieces])
        buffers = GraphBuffers(self.staging.device, max_tokens, self.max_graph_batch, stage_input)
        graphs = FullGraphs(self.model, kv_caches, buffers, self.max_graph_batch, decode, context=self.passes.graph_context,
                            mixed_sizes=mixed)
        return graphs, PiecewiseGraphs(self.model, kv_caches, buffers, pieces, self.dtype) if pieces else None

    def graph_sizes(self) -> tuple[list[int], list[int], list[int]]:
        """The sizes captured: decode batch sizes, mixed graphs' and piecewise graphs' token counts (no mixed or
        piecewise graphs under expert parallelism; mixed ones capture the Triton prefill kernel, since the torch
        reference reads the metadata's Python lists). Mixed graphs stop at MIXED_MAX_TOKENS: a longer step's GPU time
        leaves the piecewise graphs' host time hidden."""
        pieces = [] if self.expert_parallel else piecewise_sizes(self.config.scheduler.max_num_batched_tokens)
        mixed = [s for s in pieces if s <= MIXED_MAX_TOKENS] if self.triton else []
        return capture_sizes(self.max_graph_batch), mixed, pieces

    @property
    def max_graph_batch(self) -> int:
        return min(self.config.scheduler.max_num_seqs, 512)

    def initialize_kv_cache(self, kv_caches: list[torch.Tensor]) -> None:
        self.kv_caches = kv_caches
        self.persistent = self._persistent_decode(kv_caches)
        if self.rebalancer is not None:  # the profiling passes counted made-up tokens
            for layer in self.rebalancer.layers:
                layer.map.window.zero_()
        if self.uses_cuda_graphs:
            free_before = free_device_memory()
            self.graphs, self.piecewise = self.capture_graphs(kv_caches)
            self.persistent_graphs = {rows: self._capture_persistent(launch, self.graphs.buffers.pool)
                                      for rows, launch in self.persistent.items()}
            self.graph_memory_bytes = free_before - free_device_memory()
            logger.info("CUDA graphs hold %.3f GiB", self.graph_memory_bytes / 2**30)

    def _persistent_decode(self, kv_caches: list[torch.Tensor]) -> dict[int, PersistentDecode]:
        """The one-launch decode pass for this model and cache, a launch for each batch of 1 to
        ``PERSISTENT_CONFIG["max_rows"]`` requests, each compiled and checked by a pass over the null block (block 0,
        which nothing reads); none where the engine's arguments, the device or the model rule it out."""
        if not (self.config.model.persistent_decode and self.triton):
            return {}
        from raygrid.kernels.persistent_decode import PERSISTENT_CONFIG, PersistentDecode  # Triton: only with a GPU

        reason = PersistentDecode.unsupported(self.model, kv_caches)
        if reason:
            logger.info("decode passes layer by layer: %s", reason)
            return {}
        launches = {}
        for rows in range(1, min(PERSISTENT_CONFIG["max_rows"], self.config.scheduler.max_num_seqs) + 1):
            launch = PersistentDecode(self.model, kv_caches, rows=rows)
            zeros = torch.zeros(rows, dtype=torch.long, device=self.device)
            launch(zeros, zeros, zeros, torch.zeros(rows, 1, dtype=torch.int32, device=self.device), zeros.int() + 1)
            launch.check()
            launches[rows] = launch
        return launches

    def _capture_persistent(self, launch: PersistentDecode, pool) -> CallGraph:
        """A one-launch pass as a CUDA graph over the staged fields of a decode step of its rows (captured on the null
        block; a replay reads whatever the step staged there)."""
        rows = launch.rows
        staged = self.staging.stage(input_ids=np.zeros(rows, np.int64), positions=np.zeros(rows, np.int64),
                                    slot_mapping=np.zeros(rows, np.int64),
                                    block_tables=np.zeros((rows, self.max_blocks_per_req), np.int64),
                                    seq_lens=np.ones(rows, np.int32))
        inputs = tuple(staged[name] for name in ("input_ids", "positions", "slot_mapping", "block_tables", "seq_lens"))
        graph = CallGraph(launch, inputs, pool)
        launch.check()
        return graph

    def _takes_persistent(self, num_reqs: int, num_tokens: int, meta: AttentionMetadata) -> bool:
        """A decode step of a few requests whose contexts together the one-launch pass takes."""
        return (num_tokens == num_reqs and num_reqs in self.persistent
                and sum(meta.seq_lens) <= self.persistent[num_reqs].max_context)

    # ------------------------------------------------------------------ state

    def reset_requests(self) -> None:
        self.requests.clear()
        self.rejected.clear()
        self.batch = InputBatch(self.batch.max_num_reqs, self.config.model.max_model_len, self.max_blocks_per_req, self.batch.eos_token_ids)
        self.sampling_inputs.token_counts.reset()
        self.prev_sampled, self.prev_sampled_index = None, {}

    def _update_states(self, so: SchedulerOutput) -> dict[str, str]:
        """Apply the step's deltas to the persistent batch; returns the new requests refused (a parameter
        the batch cannot hold, say), which this step and later ones leave out."""
        for req_id in so.finished_req_ids:
            self.requests.pop(req_id, None)
            self.rejected.pop(req_id, None)
            self.batch.remove(req_id)
        # Requests not scheduled this step (preempted, or out of budget) leave the batch but keep their state.
        for req_id in [r for r in self.batch.req_ids if r not in so.num_scheduled_tokens]:
            self.batch.remove(req_id)
        refused = {}
        for new in so.scheduled_new_reqs:
            state = CachedRequestState(
                req_id=new.req_id,
                token_ids=list(new.token_ids),
                num_prompt_tokens=new.num_prompt_tokens,
                sampling_params=new.sampling_params,
                block_ids=list(new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
            )
            try:
                self.batch.add(state)
            except (ValueError, TypeError, OverflowError) as error:  # what validation missed: this request alone fails
                refused[new.req_id] = f"{type(error).__name__}: {error}"
                continue
            self.requests[new.req_id] = state
        self.rejected.update(refused)
        cached = so.scheduled_cached_reqs
        batch = self.batch
        rows, num_computed = [], []
        one_token_rows, one_tokens = [], []
        for i, req_id in enumerate(cached.req_ids):
            if req_id in self.rejected:
                continue  # scheduled again before the scheduler heard of the refusal (async scheduling)
            state = self.requests[req_id]
            new_tokens, new_blocks = cached.new_token_ids[i], cached.new_block_ids[i]
            resumed = cached.resumed_from_preemption[i]
            state.token_ids.extend(new_tokens)
            if resumed:
                state.block_ids = list(new_blocks)
            else:
                state.block_ids.extend(new_blocks)
            state.num_computed_tokens = cached.num_computed_tokens[i]
            row = batch.index_of.get(req_id)
            if row is None:
                batch.add(state)
                continue
            if resumed:
                batch.renew(req_id)
            if len(new_tokens) == 1:  # a decode step: written for all such rows at once below
                one_token_rows.append(row)
                one_tokens.append(new_tokens[0])
            elif new_tokens:
                batch.append_tokens(req_id, new_tokens)
            if new_blocks or resumed:
                batch.set_blocks(req_id, new_blocks, replace=resumed)
            rows.append(row)
            num_computed.append(state.num_computed_tokens)
        if one_token_rows:
            batch.append_one_token_each(one_token_rows, one_tokens)
        batch.num_computed_tokens[rows] = num_computed
        return refused

    # ------------------------------------------------------------------ inputs

    def _prepare_inputs(self, so: SchedulerOutput):
        """Vectorized over the batch's rows: no Python loop over tokens."""
        self.staging.next_step()
        batch = self.batch
        n = batch.num_reqs
        num_sched = np.fromiter((so.num_scheduled_tokens[r] for r in batch.req_ids), dtype=np.int64, count=n)
        cu = np.cumsum(num_sched)
        total = int(cu[-1])
        num_computed = batch.num_computed_tokens[:n]
        if total == n:  # a decode step: a token a row, at the row's next position
            row_of_token, positions = self._row_numbers[:n], num_computed.copy()
        else:
            row_of_token = np.repeat(np.arange(n), num_sched)
            positions = num_computed[row_of_token] + (np.arange(total) - np.repeat(cu - num_sched, num_sched))
        input_ids = batch.token_ids[row_of_token, positions]
        slot_mapping = batch.block_table[row_of_token, positions // self.block_size] * self.block_size + positions % self.block_size
        seq_lens = num_computed + num_sched
        query_start_loc = np.concatenate(([0], cu))
        # A request samples once its sequence is computed to the end (not mid-prompt).
        sample_rows = np.nonzero(seq_lens >= batch.num_tokens[:n])[0]

        # Async scheduling: a position past the tokens this worker knows is the token the previous
        # step sampled for that request, still on the device.
        unknown = np.nonzero(positions >= batch.num_tokens[row_of_token])[0]
        sources = None
        if len(unknown):
            sources = np.fromiter((self.prev_sampled_index[batch.req_ids[row]] for row in row_of_token[unknown].tolist()), dtype=np.int64)
        # Past the mixed graphs' sizes a step's prompt attention runs eagerly, and its launches follow the batch's
        # lengths; up to them the graphs' one launch (short tiles) saves more host time than other launches would.
        prompt_launch = (ops.prompt_launch_for(query_start_loc, seq_lens)
                         if total > MIXED_MAX_TOKENS and self.triton else None)
        # The decode kernel starts its rows longest first: a decode step's, or a prompt step's leading decode rows.
        decode_rows = n if total == n else prompt_launch.decode_rows if prompt_launch is not None else 0
        staged = self.staging.stage(
            input_ids=input_ids, positions=positions, slot_mapping=slot_mapping, logits_indices=cu[sample_rows] - 1,
            placeholder_index=unknown if len(unknown) else None, placeholder_source=sources, seq_lens=seq_lens,
            decode_order=np.argsort(-seq_lens[:decode_rows], kind="stable") if decode_rows else None,
            query_start_loc=query_start_loc, block_tables=batch.block_table[:n])
        input_ids_dev = staged["input_ids"]
        if len(unknown):
            input_ids_dev[staged["placeholder_index"]] = self.prev_sampled[staged["placeholder_source"]].to(input_ids_dev.dtype)
        meta = AttentionMetadata(
            slot_mapping=staged["slot_mapping"],
            block_tables=staged["block_tables"],
            seq_lens=seq_lens.tolist(),
            query_start_loc=query_start_loc.tolist(),
            max_query_len=int(num_sched.max()),
            seq_lens_tensor=staged["seq_lens"],
            query_start_loc_tensor=staged["query_start_loc"],
            decode_order=staged.get("decode_order"),
            prompt_launch=prompt_launch,
        )
        return input_ids_dev, staged["positions"], meta, staged["logits_indices"], sample_rows, seq_lens[sample_rows]

    # ------------------------------------------------------------------ the step

    def execute_model(self, so: SchedulerOutput, non_blocking: bool = False, defer_grammar: bool = False):
        """Run one step. With ``non_blocking`` the GPU work is only launched: the returned
        PendingRunnerOutput waits for it in ``result()``, so the engine can schedule the next step
        meanwhile (async scheduling). With ``defer_grammar`` too, a step with grammar rows launches its
        forward pass only; its sampling waits for ``sample_now()``, which the engine calls once the step
        before's tokens have advanced the grammars (the masks are filled then)."""
        start = time.perf_counter()
        if so is None:  # expert parallelism: this DP rank has no step, the others do
            self._dummy_step()
            pending = PendingRunnerOutput([], np.zeros(0, dtype=np.int64), None)
            pending.started, pending.errors = start, {}
            return pending if non_blocking else pending.result()
        refused = self._update_states(so)
        pending = self._execute(so, defer_grammar and non_blocking)
        pending.started = start
        pending.errors = refused
        pending.eplb, self._eplb_report = self._eplb_report, None
        return pending if non_blocking else pending.result()

    @torch.inference_mode()
    def _execute(self, so: SchedulerOutput, defer_grammar: bool = False) -> "PendingRunnerOutput":
        if so.is_empty or self.batch.num_reqs == 0:
            if self.expert_parallel:
                self._dummy_step()
            return PendingRunnerOutput([], np.zeros(0, dtype=np.int64), None)
        input_ids, positions, meta, logits_indices, sample_rows, sample_positions = self._prepare_inputs(so)
        intermediate = None
        if not self.pp.is_first:
            shape = (input_ids.shape[0], self.model.config.hidden_size)  # every stage refuses the same requests
            intermediate = tuple(self.pp.recv([shape, shape], self.dtype, self.device, src=self.pp.rank_in_group - 1))
        num_reqs = self.batch.num_reqs
        if self._takes_persistent(num_reqs, input_ids.shape[0], meta):
            step = (input_ids, positions, meta.slot_mapping, meta.block_tables, meta.seq_lens_tensor)
            graph = self.persistent_graphs.get(num_reqs)
            hidden = graph.run(*step) if graph is not None else self.persistent[num_reqs](*step)
            self.persistent_passes[num_reqs] += 1
        else:
            plan = self.passes.plan(self.graphs, input_ids.shape[0], num_reqs if meta.decode_only else -1, self.piecewise, num_reqs)
            hidden = self.forward(plan, input_ids, positions, meta, intermediate)
        self._after_forward()
        req_ids = list(self.batch.req_ids)
        if not self.pp.is_last:
            self.pp.send(list(hidden), dst=self.pp.rank_in_group + 1)
            return PendingRunnerOutput(req_ids, np.zeros(0, dtype=np.int64), None)
        prompt_logprobs = self._prompt_logprobs(hidden, meta)
        if not len(sample_rows):
            return PendingRunnerOutput(req_ids, sample_rows, None, None, prompt_logprobs)
        # A decode step samples every row: its logits rows are the hidden rows as they are (no gather to launch).
        logits = self.model.compute_logits(hidden if len(sample_rows) == input_ids.shape[0] else hidden[logits_indices])
        if so.grammar_req_ids and defer_grammar:
            sample = partial(self._sample, logits, so, req_ids, sample_rows, sample_positions)
            return PendingRunnerOutput.deferred(req_ids, sample_rows, prompt_logprobs, sample)
        tokens, row_logprobs = self._sample(logits, so, req_ids, sample_rows, sample_positions)
        return PendingRunnerOutput(req_ids, sample_rows, tokens, row_logprobs, prompt_logprobs)

    @torch.inference_mode()
    def _sample(self, logits: torch.Tensor, so: SchedulerOutput, req_ids: list[str], sample_rows: np.ndarray,
                sample_positions: np.ndarray):
        if so.grammar_req_ids:
            self._apply_grammars(logits, so, sample_rows)
        meta = self.sampling_inputs.build(self.batch, sample_rows, sample_positions, self.prev_sampled, self.prev_sampled_index)
        tokens, row_logprobs = self.sampler(logits, meta)
        self.sampling_inputs.record(meta, tokens)
        # The next step may need these tokens as inputs before the host has seen them.
        self.prev_sampled = tokens
        self.prev_sampled_index = {req_ids[row]: i for i, row in enumerate(sample_rows.tolist())}
        return tokens, row_logprobs

    def _apply_grammars(self, logits: torch.Tensor, so: SchedulerOutput, sample_rows: np.ndarray) -> None:
        """Structured outputs: tokens a request's grammar does not allow get -inf, before the sampler
        applies anything else (as vLLM orders it). The mask is copied as it is (from pinned host memory when
        the scheduler is in this process), on a copy stream so that it overlaps the forward pass still running,
        and each logits row picks its mask row on the device."""
        logits_position = np.full(self.batch.num_reqs, -1, dtype=np.int64)  # batch row -> logits row (-1: does not sample)
        logits_position[sample_rows] = np.arange(len(sample_rows))
        index_of = self.batch.index_of
        batch_rows = np.fromiter((index_of.get(rid, -1) for rid in so.grammar_req_ids), dtype=np.int64, count=len(so.grammar_req_ids))
        rows = np.where(batch_rows >= 0, logits_position[batch_rows], -1)
        mask_rows = np.nonzero(rows >= 0)[0]
        if not len(mask_rows):
            return
        host = torch.from_numpy(so.grammar_bitmask())
        if logits.is_cuda:
            copy_stream = self._copy_stream or torch.cuda.Stream(logits.device)
            self._copy_stream = copy_stream
            with torch.cuda.stream(copy_stream):
                bitmask = host.to(logits.device, non_blocking=True)
            torch.cuda.current_stream().wait_stream(copy_stream)
            bitmask.record_stream(torch.cuda.current_stream())
        else:
            bitmask = host
        staged = self.staging.stage(grammar_rows=rows[mask_rows], grammar_mask_rows=mask_rows)
        apply_token_bitmask(logits, bitmask, staged["grammar_rows"], staged["grammar_mask_rows"])

    def _prompt_logprobs(self, hidden: torch.Tensor, meta: AttentionMetadata) -> dict[str, tuple[int, list[SampleLogprobs]]]:
        """For the requests that ask for prompt_logprobs: the entries of the prompt tokens this step's
        positions predict (position p predicts prompt token p + 1), in slices of rows so that a long prompt
        chunk never holds all its logits at once."""
        out = {}
        batch = self.batch
        n = batch.num_reqs
        # Only rows whose step computes prompt positions that predict prompt tokens (a decode step has none): a
        # row computes from position num_computed_tokens on.
        in_prompt = np.nonzero(batch.num_computed_tokens[:n] < batch.num_prompt_tokens[:n] - 1)[0]
        for row in in_prompt.tolist():
            state = batch.states[row]
            k = state.sampling_params.prompt_logprobs
            if k is None:
                continue
            first_row, seq_len = meta.query_start_loc[row], meta.seq_lens[row]
            start = seq_len - (meta.query_start_loc[row + 1] - first_row)  # the first position computed now
            end = min(seq_len, state.num_prompt_tokens - 1)  # the last prompt token is predicted by nothing here
            if end <= start:
                continue
            targets = torch.as_tensor(batch.token_ids[row, start + 1 : end + 1], device=self.device)
            entries: list[SampleLogprobs] = []
            for lo in range(0, end - start, _PROMPT_LOGPROB_ROWS):
                hi = min(lo + _PROMPT_LOGPROB_ROWS, end - start)
                logits = self.model.compute_logits(hidden[first_row + lo : first_row + hi])
                entries += gather_logprobs(logits, targets[lo:hi], [k] * (hi - lo))
            out[state.req_id] = (start + 1, entries)
        return out

    def allocate_kv_cache(self, num_blocks: int) -> list[torch.Tensor]:
        """One ``[2, num_blocks, block_size, kv_heads, head_dim]`` tensor per local layer, in the cache's dtype."""
        shape = kv_cache_shape(self.model, self.block_size, num_blocks)
        return [zeroed_cache(shape, self.kv_dtype, self.device) for _ in self.model.layers]

    def kv_cache_bytes_per_block(self) -> int:
        per_layer = int(np.prod(kv_cache_shape(self.model, self.block_size, 1))) * self.kv_dtype.itemsize
        return per_layer * len(self.model.layers)
