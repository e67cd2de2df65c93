"""Which call in the sampling-inputs test waits for the GPU: the test's steps under torch's sync debug mode."""
import traceback
import numpy as np
import torch
from raygrid import SamplingParams
from raygrid.engine.input_batch import CachedRequestState, InputBatch
from raygrid.engine.sampler import Sampler
from raygrid.engine.sampling_inputs import SamplingInputs
from raygrid.engine.staging import StagingBuffers, step_fields

device = torch.device("cuda")
vocab, eos = 16, 2
batch = InputBatch(4, 32, 2, frozenset({eos}))
params = [SamplingParams(temperature=0.8, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.25, logprobs=2),
          SamplingParams(temperature=0.8, logit_bias={5: 2.0}, min_tokens=10),
          SamplingParams(temperature=0.8, allowed_token_ids=[3, 4, 7], bad_words_token_ids=[[6, 8]], logprobs=0)]
def enter():
    for i in range(3):
        batch.remove(f"r{i}")
    for i, p in enumerate(params):
        batch.add(CachedRequestState(f"r{i}", [1, 2, 3, 4, 5, 6], 4, p, [1], 6))
enter()
rows, positions = np.arange(3), np.array([7, 6, 7])
prev_sampled, prev_index = torch.tensor([9, 6], device=device), {"r0": 0, "r2": 1}
inputs = SamplingInputs(StagingBuffers(device, step_fields(8, 4, 2)), device, vocab, seed=0, max_reqs=4)
logits = torch.randn(3, vocab, device=device)
Sampler()(logits, inputs.build(batch, rows, positions, prev_sampled, prev_index))
for attempt in range(2):
    enter()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        meta = inputs.build(batch, rows, positions, prev_sampled, prev_index)
        print("build ok")
        tokens, logprobs = Sampler()(logits, meta)
        print("sampler ok")
        inputs.token_counts.record(meta.penalty_slots, tokens)
        print("record ok")
    except Exception:
        traceback.print_exc()
    finally:
        torch.cuda.set_sync_debug_mode(0)
