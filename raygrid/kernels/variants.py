"""Launch arguments Triton should not compile a variant for.

Triton compiles a kernel once for each variant it is launched with, and a pointer 16-byte aligned or not is two
variants. A step launching one that the engine's start did not compile waits for the compiler (0.4 to 2 s on an
H100 or H200). Where a kernel reads an input by scalar loads (a step's lengths, tables, token ids), alignment speeds
nothing up: ``unaligned(...)``, passed to ``triton.jit``, tells Triton not to specialize those pointers on it.
"""

from __future__ import annotations

import inspect

import triton

_TAKES_ALIGNMENT = "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters


def unaligned(*names: str) -> dict:
    """``triton.jit``'s (or ``gluon.jit``'s) options that leave these pointer arguments' alignment unspecialized
    (Tritons before 3.3 have no such option: there a misaligned input compiles a variant of its own)."""
    return {"do_not_specialize_on_alignment": list(names)} if _TAKES_ALIGNMENT else {}
