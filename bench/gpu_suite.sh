#!/usr/bin/env bash
# One prepared run for a lent GPU (H200): the kernel tests on CUDA, the chain-verification microbenchmark, the
# end-to-end benchmark and, with time left, adaptive K against fixed K. Installs nothing, writes only under $OUT
# (default bench/out), and finishes in under 7 minutes: every step runs under `timeout` against one deadline.
#
#   bash bench/gpu_suite.sh                 # results in bench/out
#   OUT=/tmp/results bash bench/gpu_suite.sh
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$REPO/bench/out}"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"
PY="${PYTHON:-python}"
DEADLINE=$(($(date +%s) + 400))  # 6 min 40 s for the steps; the rest is setup and the summary

# Step time: the step's own budget, capped by what is left before the deadline.
budget() {
    local left=$((DEADLINE - $(date +%s)))
    echo $((left < $1 ? left : $1))
}

# A bare checkout imports as it is: fastspec/__init__.py maps the namespace folder kernels/ to `fastspec.kernels`,
# and kernels/ (no __init__.py) never shadows Hugging Face's `kernels` package, so every step runs from $REPO.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

echo "== environment"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    dirty="$(git -C "$REPO" status --porcelain 2>/dev/null | head -c1)"
    echo "commit: $(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)${dirty:+ (uncommitted changes)}"
    echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n1)"
    (cd "$REPO" && "$PY" -c "import sys, torch, triton, transformers, fastspec.kernels as k
print('python', sys.version.split()[0], '| torch', torch.__version__, '| triton', triton.__version__,
      '| transformers', transformers.__version__, '| cuda', torch.cuda.is_available())
print('fastspec.kernels from', list(k.__path__)[0])")
} 2>&1 | tee "$OUT/env.txt"

echo "== kernel tests (CUDA)"
(cd "$REPO" && timeout "$(budget 170)" "$PY" -m pytest -x -q -p no:cacheprovider tests/test_verify_chain_kernel.py \
    tests/test_reference_verify.py tests/test_tree_kernels.py) 2>&1 | tee "$OUT/tests.log"
TESTS_RC=${PIPESTATUS[0]}

echo "== microbenchmark: triton vs reference vs HF (full grid)"
(cd "$REPO" && timeout "$(budget 130)" "$PY" bench/kernels/bench_verify.py --methods triton reference hf \
    --json "$OUT/bench_verify.json" --markdown "$OUT/bench_verify.md") >"$OUT/bench_verify.log" 2>&1
BENCH_RC=$?
tail -n 3 "$OUT/bench_verify.log"

echo "== microbenchmark: torch.compile of the reference (headline shapes)"
(cd "$REPO" && timeout "$(budget 60)" "$PY" bench/kernels/bench_verify.py --methods triton compile \
    --batch 8 --k 4 --vocab 128256 --dtype fp32 bf16 \
    --json "$OUT/bench_verify_compile.json" --markdown "$OUT/bench_verify_compile.md") \
    >"$OUT/bench_verify_compile.log" 2>&1
COMPILE_RC=$?

# ---------------------------------------------------------------------------------------------------------------
# END-TO-END BENCHMARK (`fastspec bench`): runs once fastspec/bench.py exists.
if [ -f "$REPO/fastspec/bench.py" ]; then
    echo "== end-to-end: fastspec bench --quick"
    (cd "$REPO" && timeout "$(budget 70)" "$PY" -m fastspec.cli bench --quick --device cuda \
        --json "$OUT/e2e_bench.json") >"$OUT/e2e_bench.md" 2>"$OUT/e2e_bench.log"
    E2E_RC=$?
else
    E2E_RC="skipped (no fastspec/bench.py)"
fi

# Adaptive K against fixed K, interleaved per prompt (batch 1, greedy), in whatever time is left.
LEFT=$(budget 45)
if [ "$LEFT" -gt 15 ]; then
    echo "== adaptive K vs fixed K"
    (cd "$REPO" && timeout "$LEFT" "$PY" bench/auto_vs_fixed.py --device cuda --repeats 3 --ks 2 4 6 8) \
        >"$OUT/auto_vs_fixed.txt" 2>"$OUT/auto_vs_fixed.log"
    AUTO_RC=$?
    tail -n 1 "$OUT/auto_vs_fixed.txt"
else
    AUTO_RC="skipped (no time left)"
fi
# ---------------------------------------------------------------------------------------------------------------

echo "== summary"
echo "tests rc=$TESTS_RC | bench rc=$BENCH_RC | compile bench rc=$COMPILE_RC | e2e rc=$E2E_RC | auto-K rc=$AUTO_RC" \
    "(124 = timed out)"
"$PY" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
rows, compiled = [], {}
if (out / "bench_verify.json").exists():
    rows = json.loads((out / "bench_verify.json").read_text())["rows"]
if (out / "bench_verify_compile.json").exists():
    for r in json.loads((out / "bench_verify_compile.json").read_text())["rows"]:
        compiled[(r["batch"], r["k"], r["vocab"], r["dtype"])] = r.get("x_compile")

def f(v, spec):
    return "-" if v is None else format(v, spec)

print("| B | K | V | dtype | triton us | x ref | x compile | x HF | GB/s | % copy | exact |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    if r["vocab"] != 128256 or r["k"] != 4:
        continue
    pct = 100 * r["gbps"] / r["copy_gbps"] if r.get("gbps") else None
    key = (r["batch"], r["k"], r["vocab"], r["dtype"])
    print(f"| {r['batch']} | {r['k']} | {r['vocab']} | {r['dtype']} | {f(r['us'].get('triton'), '.1f')} "
          f"| {f(r.get('x_reference'), '.1f')} | {f(compiled.get(key), '.1f')} | {f(r.get('x_hf'), '.1f')} "
          f"| {f(r.get('gbps'), '.0f')} | {f(pct, '.0f')} | {r.get('exact', '-')} |")
head = [r for r in rows if (r["batch"], r["k"], r["vocab"], r["dtype"]) == (8, 4, 128256, "fp32")]
if head and head[0].get("gbps"):
    r = head[0]
    pct = 100 * r["gbps"] / r["copy_gbps"]
    print(f"targets at B=8 K=4 V=128256 fp32: x HF {r.get('x_hf', 0):.1f} (>= 10), x ref {r.get('x_reference', 0):.1f}"
          f" (>= 5), {pct:.0f}% of copy bandwidth (>= 60)")
print(f"full tables: {out}/bench_verify.md, {out}/bench_verify_compile.md; env: {out}/env.txt")
EOF
