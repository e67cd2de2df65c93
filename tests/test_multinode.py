"""Two Ray nodes (ray.cluster_utils.Cluster: two raylets on this machine): TP groups pack onto a node, pipeline
stages land on different nodes, steps reach them by actor calls (the default there: Ray 2.60's cross-node compiled-graph channels crashed
a raylet here, ray-project/ray#63229), and greedy tokens equal one process's."""

from __future__ import annotations

import pytest
import torch
import ray
from ray.cluster_utils import Cluster

from raygrid import LLM, SamplingParams
from raygrid.parallel.rank_grid import RankGrid
from raygrid.placement.placement import check_checkpoint_readable, check_cluster_fits, place_replica, release
from tests.conftest import random_prompts, start_local_ray


@pytest.fixture(scope="module")
def two_nodes():
    borrowed = ray.is_initialized()  # the session's local cluster (conftest.py): set aside, started again after
    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()
    if borrowed:
        start_local_ray()


def test_tp2_pp2_over_two_nodes(two_nodes, qwen3_dir, tokenizer):
    """Each TP group packs onto one node, the two stages land on different nodes (two CPUs each), and greedy
    tokens equal one process's."""
    prompts = [{"prompt_token_ids": p} for p in random_prompts(4, len(tokenizer), seed=44)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    single = LLM(model=qwen3_dir, device="cpu", dtype="float32", max_model_len=256)
    expected = [o.outputs[0].token_ids for o in single.generate(prompts, params, use_tqdm=False)]
    single.shutdown()
    llm = LLM(model=qwen3_dir, device="cpu", dtype="float32", max_model_len=256, tensor_parallel_size=2,
              pipeline_parallel_size=2)
    try:
        names = llm.engine.worker_names()
        nodes = [ray.get(ray.get_actor(name).node_id.remote()) for name in names]
        transports = llm.engine.transports()
        outputs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        llm.shutdown()
    assert nodes[0] == nodes[1] and nodes[2] == nodes[3], f"a TP group was split over nodes: {nodes}"
    assert nodes[0] != nodes[2], "the two stages should have a node each (two CPUs each)"
    assert transports == ["actor calls"]
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2, "a raylet died"


def test_placement_refusals_name_what_is_missing(two_nodes, tmp_path):
    """A TP group larger than any node, more replicas than the cluster holds, and a checkpoint a node cannot
    read each fail at once with one line naming the limit (or the node and the path)."""
    with pytest.raises(ValueError, match=r"tensor_parallel_size=4 needs 4 CPU on one node; the cluster has 2 node\(s\) with 4 CPU in all, 2 on the largest"):
        check_cluster_fits(RankGrid(tp=4, pp=1), use_gpu=False, worker_cpus=1.0)
    with pytest.raises(ValueError, match=r"3 replica\(s\) of tensor_parallel_size=1 x pipeline_parallel_size=2 need 6 CPU"):
        check_cluster_fits(RankGrid(tp=1, pp=2), use_gpu=False, worker_cpus=1.0, num_replicas=3)
    slots = place_replica(RankGrid(tp=1, pp=2), use_gpu=False, worker_cpus=1.0)
    try:
        missing = tmp_path / "not-copied-here"
        with pytest.raises(ValueError, match=rf"node [0-9.]+ \(rank 0\) cannot read the checkpoint at {missing}: FileNotFoundError"):
            check_checkpoint_readable(str(missing), slots)
    finally:
        release(slots)


def test_a_head_without_gpus_configures_the_engine_for_its_gpu_workers(two_nodes, qwen3_dir):
    """The process that builds the configuration (here, like a KubeRay head, without a GPU) is not where the
    workers run: with a GPU node in the cluster, the device-dependent defaults (64-token pages, async
    scheduling) are the GPU's. The node's GPUs are Ray's logical resources; nothing runs on them."""
    from raygrid.config import CPU_BLOCK_SIZE, GPU_BLOCK_SIZE
    from raygrid.engine.arg_utils import EngineArgs

    args = dict(model=qwen3_dir, max_model_len=256, tensor_parallel_size=2)
    on_cpus = EngineArgs(**args).create_engine_config()
    gpu_node = two_nodes.add_node(num_cpus=0, num_gpus=2)
    two_nodes.wait_for_nodes()
    try:
        on_gpus = EngineArgs(**args).create_engine_config()
        pinned = EngineArgs(**args, device="cpu").create_engine_config()
    finally:
        two_nodes.remove_node(gpu_node)
    assert not torch.cuda.is_available()
    assert (on_cpus.device, on_cpus.cache.block_size, on_cpus.scheduler.async_scheduling) == ("cpu", CPU_BLOCK_SIZE, False)
    assert (on_gpus.device, on_gpus.cache.block_size, on_gpus.scheduler.async_scheduling) == ("cuda", GPU_BLOCK_SIZE, True)
    assert (pinned.device, pinned.cache.block_size) == ("cpu", CPU_BLOCK_SIZE)
