"""Cost of hashing one full KV block for the prefix cache on the scheduler's CPU: sha256 over the canonical
serialization (kv_cache.hash_block_tokens) against the Python tuple hash it replaced.
    python benchmarks/scripts/block_hash_cost.py [--block-size 16] [--output-json FILE]"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import timeit

from raygrid.engine.kv_cache import hash_block_tokens, root_block_hash


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args()
    tokens = [random.randrange(151_936) for _ in range(args.block_size)]
    parent, n = root_block_hash("bench"), 200_000
    sha = min(timeit.repeat(lambda: hash_block_tokens(parent, tokens), number=n, repeat=5)) / n
    old = min(timeit.repeat(lambda: hash((12345, tuple(tokens), ())), number=n, repeat=5)) / n
    result = {
        "block_size": args.block_size,
        "sha256_us_per_block": round(sha * 1e6, 3),
        "python_tuple_hash_us_per_block": round(old * 1e6, 3),
        "machine": f"{platform.processor() or platform.machine()}, Python {platform.python_version()}",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    print(json.dumps(result, indent=2))
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
