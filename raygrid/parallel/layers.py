"""Tensor-parallel layers. Each rank holds a shard of the weight and loads only that shard from the
checkpoint (``weight_loader`` reads a slice of the safetensors tensor, never the whole of it).

- ColumnParallelLinear: output features split; no communication (or an all-gather if asked).
- MergedColumnParallelLinear: several column layers in one (gate and up), each split alike.
- QKVParallelLinear: q, k, v heads split; with fewer kv heads than ranks, kv heads are replicated.
- RowParallelLinear: input features split; the partial products are summed by an all-reduce.
- VocabParallelEmbedding / ParallelLMHead: vocabulary rows split; lookups are masked and all-reduced,
  logits are all-gathered.
With one rank all of them are plain linear / embedding layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from raygrid.kernels import ops
from raygrid.parallel.groups import get_tp_group


def _divide(total: int, parts: int, what: str) -> int:
    if total % parts:
        raise ValueError(f"{what} ({total}) is not divisible by tensor_parallel_size ({parts})")
    return total // parts


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class ColumnParallelLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False, gather_output: bool = False) -> None:
        super().__init__()
        self.tp = get_tp_group()
        self.gather_output = gather_output
        self.out_per_rank = _divide(out_features, self.tp.world_size, "output features")
        self.weight = _param(self.out_per_rank, in_features)
        self.bias = _param(self.out_per_rank) if bias else None
        self.register_parameter("weight_scale", None)  # per output channel, with FP8 weights (models/layers/fp8.py)
        for p in (self.weight, self.bias):
            if p is not None:
                p.weight_loader = self.load_shard

    def load_shard(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        n = self.out_per_rank
        param.data.copy_(loaded.narrow(0, self.tp.rank_in_group * n, n))

    def forward(self, x: torch.Tensor, defer_scale: bool = False) -> torch.Tensor | ops.Fp8Product:
        """``defer_scale``: the caller reads an ``ops.Fp8Product`` (FP8 weights, small batches)."""
        if self.gather_output:
            return self.tp.all_gather(ops.linear(x, self.weight, self.bias, self.weight_scale), dim=-1)
        return ops.linear(x, self.weight, self.bias, self.weight_scale, defer_scale=defer_scale)


class MergedColumnParallelLinear(ColumnParallelLinear):
    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False) -> None:
        self.output_sizes = output_sizes
        super().__init__(in_features, sum(output_sizes), bias)

    def load_shard(self, param: nn.Parameter, loaded, shard_id: int) -> None:
        per_rank = [size // self.tp.world_size for size in self.output_sizes]
        offset, size = sum(per_rank[:shard_id]), per_rank[shard_id]
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, self.tp.rank_in_group * size, size))


class QKVParallelLinear(ColumnParallelLinear):
    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False) -> None:
        tp_size = get_tp_group().world_size
        self.head_dim = head_dim
        self.num_heads = _divide(num_heads, tp_size, "num_attention_heads")
        if num_kv_heads >= tp_size:
            self.num_kv_heads = _divide(num_kv_heads, tp_size, "num_key_value_heads")
            self.kv_replicas = 1
        else:  # fewer kv heads than ranks: each kv head lives on tp_size / num_kv_heads ranks
            self.num_kv_heads = 1
            self.kv_replicas = _divide(tp_size, num_kv_heads, "tensor_parallel_size over num_key_value_heads")
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp_size
        super().__init__(hidden_size, out, bias)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def load_shard(self, param: nn.Parameter, loaded, shard_id: str) -> None:
        rank = self.tp.rank_in_group
        if shard_id == "q":
            offset, size, src_head = 0, self.q_size, rank * self.num_heads
        else:
            offset = self.q_size + (0 if shard_id == "k" else self.kv_size)
            size, src_head = self.kv_size, (rank // self.kv_replicas) * self.num_kv_heads
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, src_head * self.head_dim, size))


class RowParallelLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.tp = get_tp_group()
        self.in_per_rank = _divide(in_features, self.tp.world_size, "input features")
        self.weight = _param(out_features, self.in_per_rank)
        self.weight.weight_loader = self.load_shard
        self.register_parameter("weight_scale", None)  # per output channel, with FP8 weights (models/layers/fp8.py)
        self.bias = _param(out_features) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = lambda param, loaded, shard_id=None: param.data.copy_(loaded.narrow(0, 0, loaded.shape[0]))

    def load_shard(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        n = self.in_per_rank
        param.data.copy_(loaded.narrow(1, self.tp.rank_in_group * n, n))

    def forward(self, x: torch.Tensor, defer_scale: bool = False) -> torch.Tensor | ops.Fp8Product:
        """``defer_scale``: the caller reads an ``ops.Fp8Product`` (FP8 weights, small batches), if this rank holds the
        whole sum: each rank's product has its own input scales, so the all-reduce needs them applied."""
        if defer_scale and self.tp.world_size == 1 and self.bias is None:
            return ops.linear(x, self.weight, weight_scale=self.weight_scale, defer_scale=True)
        y = self.tp.all_reduce(ops.linear(x, self.weight, weight_scale=self.weight_scale))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.tp = get_tp_group()
        self.vocab_size = vocab_size
        self.per_rank = -(-vocab_size // self.tp.world_size)
        self.start = self.tp.rank_in_group * self.per_rank
        self.end = min(self.start + self.per_rank, vocab_size)
        self.weight = _param(self.per_rank, hidden_size)
        self.weight.weight_loader = self.load_shard

    def load_shard(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        rows = self.end - self.start
        param.data.zero_()  # rows past the vocabulary (padding of the last shard) stay zero
        param.data[:rows].copy_(loaded.narrow(0, self.start, rows))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.world_size == 1:
            return F.embedding(input_ids, self.weight)
        mine = (input_ids >= self.start) & (input_ids < self.end)
        local = torch.where(mine, input_ids - self.start, 0)
        out = F.embedding(local, self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        return self.tp.all_reduce(out)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states times this (vocabulary x hidden) matrix: the LM head, tied or not."""
        logits = self.tp.all_gather(F.linear(hidden, self.weight), dim=-1)
        return logits[..., : self.vocab_size]


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection of an untied model (or of the last pipeline stage): sharded like the embedding."""
