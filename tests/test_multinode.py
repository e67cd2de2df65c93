"""Two Ray nodes (ray.cluster_utils.Cluster: two raylets on this machine): pipeline stages land on different
nodes, steps reach them by actor calls (the default there: Ray 2.60's cross-node compiled-graph channels crashed
a raylet here, ray-project/ray#63229), and greedy tokens equal one process's."""

from __future__ import annotations

import pytest
import ray
from ray.cluster_utils import Cluster

from raygrid import LLM, SamplingParams
from tests.conftest import random_prompts


@pytest.fixture(scope="module")
def two_nodes():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_pipeline_stages_on_two_nodes(two_nodes, qwen3_dir, tokenizer):
    prompts = [{"prompt_token_ids": p} for p in random_prompts(4, len(tokenizer), seed=44)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    single = LLM(model=qwen3_dir, device="cpu", dtype="float32", max_model_len=256)
    expected = [o.outputs[0].token_ids for o in single.generate(prompts, params, use_tqdm=False)]
    single.shutdown()
    llm = LLM(model=qwen3_dir, device="cpu", dtype="float32", max_model_len=256, pipeline_parallel_size=2)
    try:
        names = llm.engine.worker_names()
        nodes = {ray.get(ray.get_actor(name).node_id.remote()) for name in names}
        transports = llm.engine.transports()
        outputs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        llm.shutdown()
    assert len(nodes) == 2, "each stage should have a node of its own (one CPU each)"
    assert transports == ["actor calls"]
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2, "a raylet died"
