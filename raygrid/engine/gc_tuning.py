"""The cyclic garbage collector while a process serves: what startup made is frozen out of its sight, and a full
collection waits for SERVING_FULL_COLLECTION_AFTER younger ones instead of CPython's 10.

Under load a full collection stops the whole process: the engine's step loop, or an API server's event loop. On
the H200's host, with 2,000 requests in flight (benchmarks/README.md, "`/health` under full load"), the API
servers' full collections took 25 to 420 ms each, the engine process's 20 to 50 ms, and under load they freed
nothing: they walked startup's objects (imports, model, tokenizer, app) and the live requests' ones, none of them
garbage. Reference counting frees almost everything; the young generations, where a request's short-lived cycles
die, are still collected as before. vLLM freezes its engine and API server processes in the same way.

Engines and API servers may share a process (``--engine-in-process``, the DP ranks of one world): ``hold`` and
``release`` are counted, and the last release restores the collector as the first hold found it. A holder releases
from a ``weakref.finalize``, which a collection may run on the very thread that holds the lock (``hold``'s own
``gc.collect()`` finalizing an engine dropped earlier): the lock is reentrant.
"""

from __future__ import annotations

import gc
import threading

SERVING_FULL_COLLECTION_AFTER = 10_000


class _ServingCollector:
    _lock = threading.RLock()
    _holders = 0
    _saved: tuple[int, ...] = ()

    @classmethod
    def hold(cls) -> None:
        """Freeze what exists now (a later holder freezes what it made since) and defer full collections."""
        with cls._lock:
            if cls._holders == 0:
                cls._saved = gc.get_threshold()
                gc.set_threshold(cls._saved[0], cls._saved[1], max(cls._saved[2], SERVING_FULL_COLLECTION_AFTER))
            cls._holders += 1
            gc.collect()
            gc.freeze()

    @classmethod
    def release(cls) -> None:
        with cls._lock:
            cls._holders -= 1
            if cls._holders == 0:
                gc.set_threshold(*cls._saved)
                gc.unfreeze()


hold_serving_collector = _ServingCollector.hold
release_serving_collector = _ServingCollector.release
