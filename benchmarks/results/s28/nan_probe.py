"""Command 1's nano_batch_overlap.py run (--batches 32 256) gave NaN in the whole 256-row pass (its reference),
where the twenty-seventh session's (--batches 32 64 128 192 256) gave none. The same inputs again: which rows and
which layer first hold NaN, and whether the torch references (ops with RAYGRID_USE_TRITON=0 in a second process)
give NaN on them too.

    python benchmarks/results/s28/nan_probe.py OUT.json
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
from nano_batch_overlap import decode_batch, model_and_caches  # noqa: E402


def main() -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    model, caches = model_and_caches(device)
    report = {"triton": os.environ.get("RAYGRID_USE_TRITON", "1"), "cache_nan": any(bool(c.isnan().any()) for c in caches)}
    for batch in (32, 256):  # as the run: the 32-row batch's draws come first
        contexts = torch.randint(300, 1801, (batch,)).tolist()
        ids, positions, meta = decode_batch(contexts, device)
        if batch == 32:
            with torch.inference_mode():
                model(ids, positions, caches, meta)
            continue
        first_nan = {}
        hooks = [layer.register_forward_hook(lambda mod, inp, out, i=i: first_nan.setdefault(
            "layer", i) if any(bool(t.isnan().any()) for t in (out if isinstance(out, tuple) else (out,))) else None)
                 for i, layer in enumerate(model.layers)]
        with torch.inference_mode():
            out = model(ids, positions, caches, meta)
        for h in hooks:
            h.remove()
        bad = out.float().isnan().any(dim=-1).nonzero().flatten().tolist()
        report.update(rows=batch, nan_rows=bad[:50], nan_row_count=len(bad), first_nan_layer=first_nan.get("layer"),
                      nan_contexts=[contexts[r] for r in bad[:20]], nan_ids=[int(ids[r]) for r in bad[:20]],
                      table_max=int(meta.block_tables.max()), table_min=int(meta.block_tables.min()),
                      cache_nan_after=any(bool(c.isnan().any()) for c in caches))
    print(json.dumps(report), flush=True)
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
