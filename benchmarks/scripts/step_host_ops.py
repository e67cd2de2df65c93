"""Host time of the persistent batch's per-step work at 256 rows, on the CPU (no device needed): the logit
adjustments of a step (one row of 256 has a logit_bias) and a decode step's one-token appends, per-row
(``append_tokens``) and vectorized (``append_one_token_each``, where the checkout has it).

    python benchmarks/scripts/step_host_ops.py [--rows 256] [--repeats 1000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from raygrid.engine.input_batch import CachedRequestState, InputBatch
from raygrid.engine.sampling_params import SamplingParams


def per_call_us(fn, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=1000)
    args = parser.parse_args()
    batch = InputBatch(args.rows, 8192, 512, frozenset({2}))
    for i in range(args.rows):
        params = SamplingParams(temperature=1.0, logit_bias={3: 1.0} if i == 9 else None)
        batch.add(CachedRequestState(f"r{i}", list(range(520)), 512, params, [1] * 33, 512))
    rows, positions = np.arange(args.rows), np.full(args.rows, 530)
    print(f"logit_adjustments: {per_call_us(lambda: batch.logit_adjustments(rows, positions), args.repeats):.0f} us a step")
    ids = list(batch.req_ids)
    repeats = min(args.repeats, 2000)  # each call appends a token to every row
    print(f"append_tokens, row by row: {per_call_us(lambda: [batch.append_tokens(r, [5]) for r in ids], repeats):.0f} us a step")
    if hasattr(batch, "append_one_token_each"):
        row_list = [batch.index_of[r] for r in ids]
        print(f"append_one_token_each: {per_call_us(lambda: batch.append_one_token_each(row_list, [5] * len(row_list)), repeats):.0f} us a step")


if __name__ == "__main__":
    main()
