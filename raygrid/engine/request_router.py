"""Which owner (an engine replica, a DP rank) holds each unfinished request, and how many each holds; a new
request goes to the least loaded owner that can take it. Used by every front end over several engines
(cluster/ray_engine.py's replicas, engine/dp_engine.py's DP ranks)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable


class LeastLoadedRouter:
    def __init__(self) -> None:
        self._owner: dict[str, int] = {}  # unfinished request id -> owner
        self._load: Counter[int] = Counter()

    def assign(self, request_id: str, candidates: Iterable[int]) -> int:
        """Give ``request_id`` to the candidate owning the fewest unfinished requests (the first among equals)."""
        owner = min(candidates, key=lambda o: self._load[o])
        self._owner[request_id] = owner
        self._load[owner] += 1
        return owner

    def release(self, request_id: str) -> int | None:
        """The request finished or was aborted: its owner, or None if it had none (already released)."""
        owner = self._owner.pop(request_id, None)
        if owner is not None:
            self._load[owner] -= 1
        return owner

    def release_all(self, owner: int) -> list[str]:
        """The owner is gone: the requests it held, released."""
        held = [rid for rid, o in self._owner.items() if o == owner]
        for rid in held:
            del self._owner[rid]
        self._load[owner] = 0
        return held

    def load(self, owner: int) -> int:
        return self._load[owner]

    def __bool__(self) -> bool:
        return bool(self._owner)
