"""The Gluon prompt kernel with one constexpr set two ways (argv[2], e.g. TREE), alternating twice on the sweep's cases:
TFLOP/s and the largest error against SDPA for each. argv[1]: the JSON to write."""
import sys, json
import torch
import torch.nn.functional as F
from triton.testing import do_bench
sys.path.insert(0, "benchmarks/scripts")
from sweep_prefill_attention import HEAD_DIM, HEADS, make_case
from raygrid.kernels import gluon_attention as ga

NAME = sys.argv[2]

def launch(query, kv_cache, block_tables, seq_lens, query_start_loc, scale, out, value):
    num_tokens, num_heads, head_dim = query.shape
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    num_blocks, page, num_kv_heads, _ = k_cache.shape
    rows = num_blocks * page
    queries = query.as_strided((num_tokens, num_heads * head_dim), (query.stride(0), 1))
    num_seqs = seq_lens.shape[0]
    ga._prefill_kernel[(num_heads // 2, num_tokens // ga.TOKENS + num_seqs)](
        ga._descriptor(queries, ga.TOKENS), ga._descriptor(k_cache.view(rows, num_kv_heads * head_dim), ga.BLOCK_N),
        ga._descriptor(v_cache.view(rows, num_kv_heads * head_dim), ga.BLOCK_N), block_tables, seq_lens, query_start_loc, out,
        scale, num_seqs, out.stride(0), out.stride(1), block_tables.stride(0), 1,
        QUERIES_PER_KV=num_heads // num_kv_heads, PAGE=page, STAGES=ga.STAGES, num_warps=4, **{NAME: value})
    return out

res = []
for seqs, length, prefix in [(1, 8192, 0), (1, 32768, 0), (8, 8192, 0), (1, 8192, 8192), (1, 8192, 16384), (1, 8192, 24576), (1, 4096, 0)]:
    (q, k, v), (packed, cache, tables, lens, starts) = make_case(seqs, prefix + length, prefix, "random", 64)
    scale = HEAD_DIM**-0.5
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)[:, :, prefix:].transpose(1, 2).reshape(seqs * length, HEADS, HEAD_DIM)
    out = torch.empty_like(packed)
    flops = seqs * 4 * length * (prefix + length / 2) * HEAD_DIM * HEADS
    for rnd in range(2):
        for value in (False, True):
            err = (launch(packed, cache, tables, lens, starts, scale, out, value).float() - expected.float()).abs().max().item()
            ms = do_bench(lambda: launch(packed, cache, tables, lens, starts, scale, out, value), warmup=5, rep=40)
            res.append(dict(case=f"{seqs}x{length}@{prefix}", **{NAME: value}, ms=round(ms, 3), tflop_per_s=round(flops / ms / 1e9, 1), max_abs_error=err))
            print(res[-1], flush=True)
    del q, k, v, packed, cache
json.dump(res, open(sys.argv[1], "w"), indent=1)
