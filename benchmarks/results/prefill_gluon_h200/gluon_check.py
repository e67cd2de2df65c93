import sys, torch, json
sys.path.insert(0, "tests")
from test_kernels import prefill_case, paged_attention_ref
from raygrid.kernels.triton_attention import paged_attention_prefill
res = {}
MODE = sys.argv[1] if len(sys.argv) > 1 else True
MODE = True if MODE == "true" else MODE
torch.manual_seed(0)
for name, cases in {"mixed": [(0, 500), (1000, 300), (0, 1), (77, 1), (16, 129), (0, 64), (5, 2000)],
                    "one": [(0, 4096)], "chunk": [(3000, 1000)], "tiny": [(0, 3), (10, 70)]}.items():
    cache, tables, seq_lens, starts, query = prefill_case(cases, 64, 16, 8, 128, torch.bfloat16)
    for row, n in enumerate(seq_lens):
        cache[:, tables[row, (n - 1) // 64], (n - 1) % 64 + 1:] = float("nan")
    lens, qs = (torch.tensor(v, dtype=torch.int32, device="cuda") for v in (seq_lens, starts))
    exp = paged_attention_ref(query, cache, tables, seq_lens, starts, 128 ** -0.5)
    tri = paged_attention_prefill(query, cache, tables, lens, qs, 128 ** -0.5, gluon=False)
    glu = paged_attention_prefill(query, cache, tables, lens, qs, 128 ** -0.5, gluon=MODE)
    res[name] = dict(triton=(tri.float() - exp.float()).abs().max().item(), gluon=(glu.float() - exp.float()).abs().max().item(),
                     gluon_nan=bool(torch.isnan(glu).any()))
    # padded: spare rows and padding sequences
    out = torch.full((query.shape[0] + 19, 16, 128), 7.0, dtype=torch.bfloat16, device="cuda")
    q2 = torch.cat([query, torch.randn(19, 16, 128, dtype=torch.bfloat16, device="cuda")])
    ptab = torch.cat([tables, torch.zeros(3, tables.shape[1], dtype=tables.dtype, device="cuda")])
    plens = torch.cat([lens, torch.zeros(3, dtype=torch.int32, device="cuda")])
    pqs = torch.cat([qs, torch.full((3,), int(qs[-1]), dtype=torch.int32, device="cuda")])
    paged_attention_prefill(q2, cache, ptab, plens, pqs, 128 ** -0.5, out=out, gluon=MODE)
    n = query.shape[0]
    res[name]["padded"] = (out[:n].float() - exp.float()).abs().max().item()
    res[name]["padded_untouched"] = bool((out[n:] == 7.0).all())
print(json.dumps(res, indent=1))
