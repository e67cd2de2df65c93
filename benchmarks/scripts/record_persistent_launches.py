"""The one-launch decode pass's launches at Qwen3-0.6B's real shape (two layers, a 32-slice context), recorded under
Triton's interpreter without running them, as the launches JSON that ``tests/kernel_builds.py`` builds for sm_90 with
no GPU (registers, spills and shared memory of each variant):

    python benchmarks/scripts/record_persistent_launches.py '[{}, {"preload": 3}]' > launches.json
    PYTHONPATH=/tmp/triton36:$PWD python -m tests.kernel_builds ptxas < launches.json > built.json

Each list item is a JSON object of ``PersistentDecode`` keyword arguments (the compile test's own launches are at tiny
sizes, where a unit's tiles are not the engine's); ``rows`` above 1 takes 32 / rows slices of the context."""

from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import Qwen3Config  # noqa: E402

from raygrid.kernels.persistent_decode import PERSISTENT_CONFIG, PersistentDecode  # noqa: E402
from tests.test_kernels_compile import decode_step, qwen3_for_one_launch, record_launches  # noqa: E402


def main() -> None:
    variants = json.loads(sys.argv[1])
    config = Qwen3Config(vocab_size=256, hidden_size=1024, intermediate_size=3072, num_hidden_layers=2,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096)
    model = qwen3_for_one_launch(config, torch.bfloat16)
    caches = [torch.zeros(2, 8, 64, 8, 128, dtype=torch.bfloat16) for _ in range(2)]

    def launch_each() -> None:
        for variant in variants:
            variant = dict(variant)
            # refused on CPU tensors (it asks a GPU's L2), and 0 there by default: set past the check, the GPU's default
            kv_ahead = variant.pop("kv_ahead", PERSISTENT_CONFIG["kv_ahead"])
            rows = variant.get("rows", 1)
            # the slices an H100's 264 programs give each (row, kv head), as the engine's launch takes them
            runner = PersistentDecode(model, caches, **{"splits": max(1, 32 // rows), **variant})
            runner.constexprs["KV_AHEAD"] = kv_ahead
            decode_step(runner, rows)

    with pytest.MonkeyPatch.context() as monkeypatch:
        json.dump(record_launches(monkeypatch, launch_each, run=False), sys.stdout)


if __name__ == "__main__":
    main()
