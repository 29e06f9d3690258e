#!/usr/bin/env bash
# One prepared, unattended run for a lent GPU (H200): the kernel tests on CUDA, the compile table (every kernel
# specialisation compiled by the device's Triton, registers and spills from its ptxas and as loaded on the device;
# on the CPU cores while the tests use the GPU), the chain-verification microbenchmark (host and device time apart,
# reduced grid) and the end-to-end benchmark with the time left.
# Installs nothing and needs no network: it runs from a bare copy of the tree (PYTHONPATH=$REPO). Every step runs
# under `timeout` against one deadline (SUITE_SECONDS, default 450 s: inside 8 minutes with the summary), keeps
# its result whatever happens to the others, and the summary is written last (and after every step).
#
# $OUT (default bench/out) receives at most 8 files:
#   summary.md         environment, each step's status and time, headline numbers, test failures, compile table
#   tests.log          pytest -v output (no -x: one failure skips nothing)
#   tests.xml          the same as JUnit XML
#   bench_verify.md    microbenchmark table: host, enqueue and device (CUDA-graph replay) µs, % of copy bandwidth
#   bench_verify.json
#   e2e.md             end-to-end tokens/s, acceptance, first mismatch vs HF generate
#   e2e.json
#   logs.tar.gz        every step's own stdout/stderr, the compile table as JSON, the environment details
#
#   bash bench/gpu_suite.sh                           # results in bench/out
#   OUT=/tmp/results bash bench/gpu_suite.sh
#   SUITE_CPU_SMOKE=1 bash bench/gpu_suite.sh         # no CUDA: every step in a small CPU variant (~30 s idle;
#                                                     # tests/test_gpu_bench_scripts.py runs it in CI)
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$REPO/bench/out}"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"
PY="${PYTHON:-python3}"
START=$(date +%s)
SMOKE=0
[ "${SUITE_CPU_SMOKE:-0}" = 1 ] && SMOKE=1
SECONDS_ALLOWED=${SUITE_SECONDS:-$([ "$SMOKE" = 1 ] && echo 120 || echo 450)}
DEADLINE=$((START + SECONDS_ALLOWED))
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_suite.XXXXXX")"  # logs; only the 8 files above go to $OUT
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # a bare checkout imports as it is (fastspec maps kernels/)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cd "$REPO" || exit 1

left() { echo $((DEADLINE - $(date +%s))); }
# The step budget: its own cap, less what must stay for the steps after it, never past the deadline.
budget() {
    local cap=$1 keep=${2:-0} rest
    rest=$(($(left) - keep))
    echo $((rest < cap ? rest : cap))
}

declare -a STEPS=()
record() {  # name, status, seconds
    STEPS+=("| $1 | $2 | $3 |")
    write_summary
}
status_of() {  # exit code -> words
    case "$1" in
        0) echo "ok" ;;
        124 | 137) echo "timed out (rc $1)" ;;
        *) echo "failed (rc $1)" ;;
    esac
}

write_summary() {
    {
        echo "# GPU suite summary"
        echo
        echo "started $(date -u -d "@$START" +%Y-%m-%dT%H:%M:%SZ 2>/dev/null || echo "$START"), $(($(date +%s) - START)) s so far" \
            "of a $SECONDS_ALLOWED s deadline$([ "$SMOKE" = 1 ] && echo ' (CPU smoke mode)')"
        echo
        [ -f "$WORK/env.txt" ] && sed 's/^/    /' "$WORK/env.txt" && echo
        echo "| step | status | seconds |"
        echo "|---|---|---|"
        printf '%s\n' "${STEPS[@]}"
        echo
        "$PY" - "$OUT" "$WORK" <<'EOF' 2>&1
import json, sys
import xml.etree.ElementTree as ET
from pathlib import Path

out = Path(sys.argv[1])
junit = out / "tests.xml"
if junit.exists():
    try:
        root = ET.parse(junit).getroot()
        suites = [root] if root.tag == "testsuite" else list(root)
        count = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
        print(f"tests: {count['tests']} run, {count['failures']} failed, {count['errors']} errors, "
              f"{count['skipped']} skipped")
        for case in root.iter("testcase"):
            for bad in list(case.findall("failure")) + list(case.findall("error")):
                msg = (bad.get("message") or "").splitlines()[0][:200] if bad.get("message") else ""
                print(f"- FAILED {case.get('classname')}::{case.get('name')}: {msg}")
        print()
    except ET.ParseError as exc:
        print(f"tests.xml unreadable: {exc}\n")
bench = out / "bench_verify.json"
if bench.exists():
    try:
        result = json.loads(bench.read_text())
        rows = result["rows"]
        print(f"microbenchmark: {len(rows)} rows; inexact: "
              f"{[(r['batch'], r['k'], r['vocab'], r['dtype'], r['mode'], r['method']) for r in rows if r.get('exact') is False] or 'none'}")
        md = out / "bench_verify.md"  # its notes and the issue's targets (headline lines)
        for line in md.read_text().splitlines() if md.exists() else []:
            if line.startswith("- "):
                print(line)
        print()
        print("| B | K | V | dtype | mode | method | host µs | enqueue µs | device µs | % bw |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        f = lambda v, s: "–" if v is None else format(v, s)
        for r in rows:
            if r["method"] in ("lean", "triton", "reference") and r["vocab"] == 128256:
                print(f"| {r['batch']} | {r['k']} | {r['vocab']} | {r['dtype']} | {r['mode']} | {r['method']} "
                      f"| {f(r.get('host_us'), '.1f')} | {f(r.get('enqueue_us'), '.1f')} | {f(r.get('device_us'), '.1f')} "
                      f"| {f(r.get('bw_pct'), '.0f')} |")
        print()
    except Exception as exc:  # a half-written file: say so, keep the rest of the summary
        print(f"bench_verify.json unreadable: {type(exc).__name__}: {exc}\n")
e2e = out / "e2e.md"
if e2e.exists():
    print(e2e.read_text())
compile_json = Path(sys.argv[2]) / "compile.json"
if compile_json.exists():
    try:
        result = json.loads(compile_json.read_text())
        if "skipped" in result:
            print(f"compile table: skipped: {result['skipped']}")
        else:
            rows, problems = result["rows"], result["problems"]
            print(f"compile table: {len(rows)} specialisations, triton {result['header']['triton']}, "
                  f"{len(problems)} problems")
            for line in problems:
                print(f"- {line[:300]}")
            print()
            print("| kernel | arch | variant | hot | registers | on device | smem B | spill st/ld B | first case (of n) |")
            print("|---|---|---|---|---|---|---|---|---|")
            for r in rows:
                if "error" in r:
                    print(f"| {r['kernel']} | {r['arch']} | {r['variant']} | {r['hot']} | error | | | | {r['cases'][0]} |")
                    continue
                device = r.get("device_registers", "–")
                if "device_spills" in r:
                    device = f"{device} ({r['device_spills']} B local)"
                print(f"| {r['kernel']} | {r['arch']} | {r['variant']} | {'yes' if r['hot'] else ''} | {r['registers']} "
                      f"| {device} | {r['smem']} | {r['spill_stores']}/{r['spill_loads']} | {r['cases'][0]} "
                      f"({len(r['cases'])}) |")
        print()
    except Exception as exc:  # a half-written file: say so, keep the rest of the summary
        print(f"compile.json unreadable: {type(exc).__name__}: {exc}\n")
EOF
    } >"$OUT/summary.md.tmp" && mv "$OUT/summary.md.tmp" "$OUT/summary.md"
    tar -czf "$OUT/logs.tar.gz" -C "$WORK" . 2>/dev/null
}

HAS_CUDA=0
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null && HAS_CUDA=1

# ------------------------------------------------------------------------------------------------ environment
t0=$(date +%s)
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    dirty="$(git -C "$REPO" status --porcelain 2>/dev/null | head -c1)"
    echo "commit: $(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo "unknown (no git)")${dirty:+ (uncommitted changes)}"
    echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | head -n1)"
    echo "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ //')"
    timeout 60 "$PY" -c "import sys, torch, triton, transformers, fastspec.kernels as k
print('python', sys.version.split()[0], '| torch', torch.__version__, '| triton', triton.__version__,
      '| transformers', transformers.__version__, '| cuda', torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else '')
print('fastspec.kernels from', list(k.__path__)[0])
import importlib.util as u
print('pytest-xdist:', u.find_spec('xdist') is not None, '| hypothesis:', u.find_spec('hypothesis') is not None,
      '| scipy:', u.find_spec('scipy') is not None)"
} >"$WORK/env.txt" 2>&1
ENV_RC=$?
cat "$WORK/env.txt"
record environment "$(status_of $ENV_RC)" $(($(date +%s) - t0))

# ----------------------------------------------------------------------- compile table (CPU cores, background)
# every kernel specialisation the host code produces, compiled for sm_90a and sm_80 by this machine's Triton and
# ptxas (bench/kernels/compile_table.py); with CUDA the sm_90 binaries are also loaded for the driver's register
# and local-memory counts. It needs no GPU time: it runs beside the kernel tests and is waited for after them.
COMPILE_PID=""
if [ "$HAS_CUDA" = 1 ] || [ "$SMOKE" = 1 ]; then
    echo "== compile table (background)"
    COMPILE_T0=$(date +%s)
    COMPILE_ARGS=(--jobs 8)
    COMPILE_BUDGET=$(budget 240 120)
    if [ "$HAS_CUDA" != 1 ]; then  # smoke: one kernel, one architecture
        COMPILE_ARGS=(--arch sm_90a --families mask --jobs 1)
        COMPILE_BUDGET=$(budget 40 40)
    fi
    (
        timeout -k 10 "$COMPILE_BUDGET" "$PY" bench/kernels/compile_table.py "${COMPILE_ARGS[@]}" \
            --json "$WORK/compile.json" --markdown "$WORK/compile.md" >"$WORK/compile.log" 2>&1
        echo $? >"$WORK/compile.rc"
    ) &
    COMPILE_PID=$!
fi

# ------------------------------------------------------------------------------------------ kernel tests (CUDA)
TESTS=(tests/test_verify_chain_kernel.py tests/test_chain_verifier.py tests/test_reference_verify.py
    tests/test_tree_kernels.py tests/test_properties.py tests/test_tree_properties.py tests/test_tree_sampling.py)
if [ "$HAS_CUDA" = 1 ]; then
    echo "== kernel tests (CUDA)"
    t0=$(date +%s)
    XDIST=()
    "$PY" -c "import xdist" 2>/dev/null && XDIST=(-n 4)  # parallel Triton compilation on a cold cache
    # -v: every test's outcome is in the log as it happens; SIGINT at the budget: pytest stops, still reports and
    # writes the JUnit file
    timeout -s INT -k 20 "$(budget 150 290)" "$PY" -m pytest -v -rfEs -p no:cacheprovider "${XDIST[@]}" \
        --junitxml="$OUT/tests.xml" "${TESTS[@]}" >"$OUT/tests.log" 2>&1
    rc=$?
    tail -n 3 "$OUT/tests.log"
    record "kernel tests (${#TESTS[@]} files${XDIST:+, xdist -n 4})" "$(status_of $rc)" $(($(date +%s) - t0))
elif [ "$SMOKE" = 1 ]; then  # the same command on a few interpreter tests: pytest, JUnit and the summary wired up
    t0=$(date +%s)
    timeout -s INT -k 20 "$(budget 60 60)" "$PY" -m pytest -v -rfEs -p no:cacheprovider --junitxml="$OUT/tests.xml" \
        "${TESTS[@]}" -k "out_buffers_are_written or tree_mask_hand_made" >"$OUT/tests.log" 2>&1
    rc=$?
    tail -n 3 "$OUT/tests.log"
    record "kernel tests (CPU smoke: interpreter, 2 tests)" "$(status_of $rc)" $(($(date +%s) - t0))
else
    echo "skipped: no CUDA" >"$OUT/tests.log"
    record "kernel tests" "skipped: no CUDA" 0
fi

if [ -n "$COMPILE_PID" ]; then
    wait "$COMPILE_PID"
    rc=$(cat "$WORK/compile.rc" 2>/dev/null || echo 1)
    tail -n 1 "$WORK/compile.log"
    record "compile table (${COMPILE_ARGS[*]})" "$(status_of "$rc")" $(($(date +%s) - COMPILE_T0))
else
    record "compile table" "skipped: no CUDA" 0
fi

# ------------------------------------------------------------------------------------- verify microbenchmark
if [ "$HAS_CUDA" = 1 ] || [ "$SMOKE" = 1 ]; then
    echo "== microbenchmark (reduced grid): host and device time"
    t0=$(date +%s)
    if [ "$HAS_CUDA" = 1 ]; then
        b=$(budget 110 180)
        ARGS=(--grid small --methods lean triton reference hf --time-budget $((b - 25)))
    else
        b=$(budget 60 30)
        export TRITON_INTERPRET=1
        ARGS=(--device cpu --batch 2 --k 2 --vocab 300 --dtype fp32 --methods lean reference --repeats 1 --min-calls 1
            --budget-per-timing 0.01)
    fi
    timeout -k 10 "$b" "$PY" bench/kernels/bench_verify.py "${ARGS[@]}" \
        --json "$OUT/bench_verify.json" --markdown "$OUT/bench_verify.md" >"$WORK/bench_verify.log" 2>&1
    rc=$?
    unset TRITON_INTERPRET
    tail -n 2 "$WORK/bench_verify.log"
    record "microbenchmark (${ARGS[*]:0:2})" "$(status_of $rc)" $(($(date +%s) - t0))
else
    record "microbenchmark" "skipped: no CUDA" 0
fi

# ---------------------------------------------------------------------------------------- end-to-end benchmark
if [ "$HAS_CUDA" = 1 ] || [ "$SMOKE" = 1 ]; then
    b=$(budget 400 10)
    if [ "$b" -gt 45 ] || { [ "$SMOKE" = 1 ] && [ "$b" -gt 20 ]; }; then
        echo "== end-to-end benchmark ($b s)"
        t0=$(date +%s)
        ARGS=(--budget $((b - 30)))
        [ "$HAS_CUDA" = 1 ] || ARGS=(--device cpu --tiny --pairs synthetic --rows hf_eager fs_chain --repeats 1
            --budget $((b - 15)))
        timeout -k 10 "$b" "$PY" bench/gpu_e2e.py "${ARGS[@]}" --out "$OUT" >"$WORK/e2e.log" 2>&1
        rc=$?
        record "end-to-end (${ARGS[*]})" "$(status_of $rc)" $(($(date +%s) - t0))
    else
        record "end-to-end" "skipped: $b s left" 0
    fi
else
    record "end-to-end" "skipped: no CUDA" 0
fi

echo "== summary ($(($(date +%s) - START)) s)"
write_summary
cat "$OUT/summary.md"
rm -rf "$WORK"
