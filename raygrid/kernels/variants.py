"""Launch arguments Triton should not compile a variant for.

Triton compiles a kernel once for each variant it is launched with. A step launching one that the engine's start did
not compile waits for the compiler (0.4 to 2 s on an H100 or H200). Two ways a step could:

- a pointer 16-byte aligned or not is two variants. Where a kernel reads an input by scalar loads (a step's lengths,
  tables, token ids), alignment speeds nothing up: ``unaligned(...)``, passed to ``triton.jit``, tells Triton not to
  specialize those pointers on it;
- a launch shaped by its batch size (the decode kernel's slices, keys a step and warps are constexprs): eager
  launches come in any size, so each is shaped for ``graph_rows``, a size the engine's start captured a graph at.
"""

from __future__ import annotations

import functools
import inspect


@functools.cache
def _takes_alignment() -> bool:
    import triton  # here, not above: the engine imports this module (graph_rows) where Triton may not be installed

    return "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters


def unaligned(*names: str) -> dict:
    """``triton.jit``'s (or ``gluon.jit``'s) options that leave these pointer arguments' alignment unspecialized
    (Tritons before 3.3 have no such option: there a misaligned input compiles a variant of its own)."""
    return {"do_not_specialize_on_alignment": list(names)} if _takes_alignment() else {}


def graph_rows(num_seqs: int) -> int:
    """The batch size a decode launch of ``num_seqs`` rows is shaped for: the least of 1, 2, 4, 8 and the multiples
    of 16 that holds it. The engine captures its decode graphs at these sizes (``engine/cuda_graphs.capture_sizes``,
    up to its largest batch, which counts as the next one here), so an eager launch of any size launches as a graph
    the engine's start captured, a variant Triton has compiled. A step's leading decode rows
    (``triton_attention.paged_attention_split``) would otherwise compile one while the step's requests wait: with one
    kv head a GPU and 132 SMs, 66 to 79 rows would take 6 slices, which no graph's size does."""
    return 1 << (num_seqs - 1).bit_length() if num_seqs <= 8 else -(-num_seqs // 16) * 16
