"""Long generations keep memory flat: peak memory at 250 and at 2,000 new tokens with the shipped pair.

Each length runs in a fresh subprocess (so one run's peak does not hide the other's) and reports the peak
resident set during `generate` and its growth over the resident set on entry (the kernel's high-water mark,
reset on entry: `fastspec.benchmarks.timing.PeakRSS`; blank where unmeasurable), the memory held by the two KV caches at
the end, and tokens/s (one timed run, no warm-up: the fresh process is what is measured). What should grow with
length is the KV cache (2 models x layers x 2 x heads x positions x head_dim x 4 bytes); everything else
(Python-side state, temporary buffers) should stay constant. With --static-cache the caches are preallocated for
the whole run at the prefill (prompt + length + one padded step), so growth during decoding is that allocation.

    python bench/long_run.py                       # 250 and 2000 tokens, chain K=4, greedy
    python bench/long_run.py --lengths 250 2000 --json /tmp/long_run.json   # also the rows as JSON
    python bench/long_run.py --static-cache        # the same with preallocated KV caches
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def one_run(length: int, k: int, static_cache: bool = False) -> dict:
    """Generate `length` tokens speculatively; return peak RSS, final KV-cache bytes and speed."""
    import torch

    import fastspec
    from fastspec import runner
    from fastspec.benchmarks import measure
    from fastspec.pair import load_pair
    from fastspec.prompts import heldout_prompts

    caches = []
    original_init = runner.CachedModel.__init__

    def recording_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        caches.append(self)

    runner.CachedModel.__init__ = recording_init
    tokenizer, target, draft = load_pair()
    ids = tokenizer(heldout_prompts(tokenizer, 1, 128)[0], return_tensors="pt").input_ids
    run = measure(lambda: fastspec.generate(target, ids, draft=draft, max_new_tokens=length, num_draft_tokens=k,
                                            eos_token_id=[], return_stats=True, static_cache=static_cache))  # fmt: skip
    out, stats = run.result
    kv_bytes = sum(
        layer.keys.numel() * layer.keys.element_size() * 2
        for c in caches
        for layer in c.cache.layers
        if layer.keys is not None
    )
    return {
        "new_tokens": int(out.shape[1] - ids.shape[1]),
        "peak_rss_mb": None if run.peak_bytes is None else (run.base_bytes + run.peak_bytes) / 2**20,
        "peak_rss_growth_mb": None if run.peak_bytes is None else run.peak_bytes / 2**20,
        "kv_cache_mb_at_end": kv_bytes / 2**20,
        "tokens_per_s": stats.emitted / run.seconds,
        "acceptance_rate": stats.acceptance_rate,
        "threads": torch.get_num_threads(),
    }


def _mb(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[250, 2000])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--static-cache", action="store_true", help="preallocated KV caches (fastspec.static_cache)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(one_run(args.child, args.k, args.static_cache)))
        return
    rows = []
    static = ["--static-cache"] if args.static_cache else []
    for length in args.lengths:
        done = subprocess.run([sys.executable, __file__, "--child", str(length), "--k", str(args.k), *static],
                              capture_output=True, text=True, check=True)  # fmt: skip
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"`python bench/long_run.py {' '.join(sys.argv[1:])}`\n")
    print("| new tokens | peak RSS MB | RSS growth during generate MB | KV caches at end MB | tokens/s | acceptance |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['new_tokens']} | {_mb(r['peak_rss_mb'], 0)} | {_mb(r['peak_rss_growth_mb'], 1)} | "
              f"{r['kv_cache_mb_at_end']:.1f} | {r['tokens_per_s']:.1f} | {r['acceptance_rate']:.3f} |")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
