"""Run under `torchrun --nproc-per-node 2` by tests/test_tensor_parallel.py: decode with a tensor-parallel target
(gloo on CPU) in every combination the test names and write this rank's outputs to <out>/rank<r>.json.

Usage: tp_worker.py MODEL_DIR OUT_DIR
"""

import json
import sys
import time

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

import fastspec
from fastspec.distributed import RankAgreement
from fastspec.heads import DraftHead, DraftHeadConfig

torch.set_num_threads(1)
model_dir, out_dir = sys.argv[1], sys.argv[2]
target = AutoModelForCausalLM.from_pretrained(f"{model_dir}/target", tp_plan="auto")
draft = AutoModelForCausalLM.from_pretrained(f"{model_dir}/draft")  # replicated: loaded whole on every rank
torch.manual_seed(0)  # the same random head on every rank
head = DraftHead(DraftHeadConfig.from_target_config(target.config)).eval()
rank = dist.get_rank()
ids = torch.randint(1, 256, (2, 9), generator=torch.Generator().manual_seed(0))
mask = torch.ones_like(ids)
mask[1, :4] = 0  # row 1 is left-padded: a ragged batch
cases = {
    "greedy_chain": dict(draft=draft),
    "greedy_batch2_ragged": dict(draft=draft, batch=2),
    "greedy_static_cache": dict(draft=draft, static_cache=True),
    "greedy_head": dict(draft=head),
    "greedy_dynamic_tree_auto": dict(draft=draft, tree="dynamic", num_draft_tokens="auto"),
    "sampled_no_seed": dict(draft=draft, do_sample=True),
    "sampled_seed": dict(draft=draft, do_sample=True, seed=3),
    "sampled_auto_k": dict(draft=draft, do_sample=True, num_draft_tokens="auto"),
    "sampled_head_auto_batch2": dict(draft=head, do_sample=True, num_draft_tokens="auto", batch=2),
    "sampled_dynamic_tree": dict(draft=draft, do_sample=True, tree="dynamic"),
}
results = {}
for name, kwargs in cases.items():
    rows = kwargs.pop("batch", 1)
    out = fastspec.generate(target, ids[:rows], attention_mask=mask[:rows], max_new_tokens=20, **kwargs)
    entry = {"out": out.tolist()}
    if not kwargs.get("do_sample"):
        hf = target.generate(ids[:rows], attention_mask=mask[:rows], do_sample=False, max_new_tokens=20, pad_token_id=0)
        entry["hf"] = hf.tolist()
    results[name] = entry
ranks = RankAgreement(target)
start = time.perf_counter()
for _ in range(200):
    ranks.seconds(0.01)
results["broadcast_seconds_per_step"] = (time.perf_counter() - start) / 200
results["agreement_active"] = ranks.active
with open(f"{out_dir}/rank{rank}.json", "w") as f:
    json.dump(results, f)
dist.barrier()
