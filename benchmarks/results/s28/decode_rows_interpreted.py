"""On the CPU, under Triton's interpreter: the decode attention kernel over nano_batch_overlap.py's inputs (256 rows,
contexts uniform in [300, 1800], pages drawn from a 4,096-page pool, each row's last page its own, started longest
first) against the torch reference, in float32 (the interpreter's numpy has no bfloat16). Does the kernel's own logic
give NaN or differ at this batch? It cannot say what the compiled kernel does on a GPU.

    ROWS=256 python benchmarks/results/s28/decode_rows_interpreted.py   # about 4 minutes on the 2-core CPU machine
"""

import os
import time

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from raygrid.kernels.paged_attention_ref import paged_attention_ref  # noqa: E402
from raygrid.kernels.triton_attention import paged_attention_decode  # noqa: E402

torch.manual_seed(0)
PAGE, POOL, NKV, D, H = 64, 4096, 8, 128, 16
rows = int(os.environ.get("ROWS", "256"))
contexts = torch.randint(300, 1801, (rows,)).tolist()
pages = max(-(-(c + 1) // PAGE) for c in contexts)
table = torch.randint(rows, POOL, (rows, pages), dtype=torch.int32)
seq_lens = torch.tensor([c + 1 for c in contexts], dtype=torch.int32)
last = (seq_lens - 1) // PAGE
table[torch.arange(rows), last.long()] = torch.arange(rows, dtype=torch.int32)
cache = torch.randn(2, POOL, PAGE, NKV, D) * 0.5
q = torch.randn(rows, H, D)
order = torch.argsort(-seq_lens, stable=True).to(torch.int32)
start = time.time()
out = paged_attention_decode(q, cache, table, seq_lens, D**-0.5, order=order)
ref = paged_attention_ref(q, cache, table, seq_lens.tolist(), list(range(rows + 1)), D**-0.5)
print(f"{rows} rows, {time.time() - start:.0f} s: NaN in the kernel's output {bool(out.isnan().any())}, in the "
      f"reference's {bool(ref.isnan().any())}; max abs difference {(out - ref).abs().max().item():.3g}")
