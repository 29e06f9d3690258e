"""Compile every Triton kernel specialisation fastspec's host code produces for real GPUs, on a machine without one.

The host wrappers (`verify_chain`, the lean `ChainVerifier`, `verify_tree`, `tree_mask`) run on CPU tensors at the
shapes the benchmarks and `generate` use. Triton's driver is replaced by a stand-in that reports a GPU target
(`GPUTarget("cuda", 90, 32)` for sm_90a, 80 for sm_80) and its SM count, and `JITFunction._do_compile` is
intercepted: Triton's own `run` binds the arguments and works out each launch's specialisation (dtypes, 16-byte
alignment, integers equal to 1 or divisible by 16, constexprs, warps) exactly as on the device, then nothing is
launched. Each distinct specialisation is compiled with `triton.compile` for that target, and the PTX goes through
the `ptxas -v` the installed Triton itself uses for the architecture (Triton 3.9 writes PTX 9.4: its
`ptxas-blackwell` for sm_90a; Triton 3.6: its bundled `ptxas`), which reports registers, stack and spill bytes.
Shared memory is Triton's dynamic allocation (`metadata.shared`) plus any static shared memory ptxas reports.

Runs in its own process with TRITON_INTERPRET unset (kernels defined under the interpreter are not JIT functions),
which is why the test (`tests/test_gpu_compile.py`) runs it as a subprocess. Exit codes: 0 all compiled, no
`printf`/assert left, no spill in a hot variant (batch <= 8, K or tree depth <= 8); 1 a failure (listed); 3 this
Triton cannot compile for NVIDIA here (no NVIDIA backend or no ptxas; the reason on stdout, "skip: ..."). It
imports `fastspec.kernels`, so it runs where `fastspec` imports: an install, or ``PYTHONPATH=.`` in the checkout.

    python bench/kernels/compile_table.py                     # the representative set, both architectures
    python bench/kernels/compile_table.py --full --write-results
                                                  # the whole grid -> bench/results/compile_table_<triton version>.md
    PYTHONPATH=. /work/venv36/bin/python bench/kernels/compile_table.py   # under the GPU machine's Triton 3.6
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[2]

# architecture -> (compute capability, SMs of the card the host code sizes its grids for)
ARCHES = {"sm_90a": (90, 132), "sm_80": (80, 108)}  # H100/H200 SXM, A100
HOT_BATCH, HOT_K = 8, 8
SKIP = 3


@dataclass
class Case:
    """One host-wrapper call: `family` (chain, lean, tree, mask) at a shape and sampling mode."""

    family: str
    batch: int
    k: int  # draft length (chain), tree depth (tree), nodes (mask)
    vocab: int  # V (chain, tree), prefix columns (mask)
    dtype: str
    mode: str

    @property
    def label(self) -> str:
        size = "P" if self.family == "mask" else "V"
        depth = "N" if self.family == "mask" else ("D" if self.family == "tree" else "K")
        return f"{self.family} B={self.batch} {depth}={self.k} {size}={self.vocab} {self.dtype} {self.mode}"

    @property
    def hot(self) -> bool:
        depth = 1 if self.family == "mask" else self.k
        return self.batch <= HOT_BATCH and depth <= HOT_K


@dataclass
class Spec:
    """A distinct specialisation of one kernel for one architecture, and the cases that produce it."""

    kernel: str
    arch: str
    source: object  # triton.compiler.ASTSource
    options: dict
    target: object
    cases: list[Case] = field(default_factory=list)

    @property
    def hot(self) -> bool:
        return any(c.hot for c in self.cases)

    def describe(self) -> str:
        constexprs = getattr(self.source, "constants", None) or getattr(self.source, "constexprs", {}) or {}
        named = {}
        names = list(self.source.fn.arg_names)
        for path, value in constexprs.items():
            index = path[0] if isinstance(path, tuple) else path
            name = names[index] if isinstance(index, int) else str(index)
            if name.isupper():
                named[name] = value
        flags = [n for n, v in named.items() if v is True]
        blocks = [f"{n}={v}" for n, v in named.items() if n.startswith("BLOCK_")]
        return " ".join(blocks + flags + [f"warps={self.options.get('num_warps')}"])


# ------------------------------------------------------------------------------------------------- the cases

CHAIN_MODES = ("greedy", "onehot", "probs", "top_k", "top_p", "ragged_greedy", "ragged_onehot")
GRID_FULL = dict(batch=(1, 4, 32), k=(1, 2, 4, 8), vocab=(4096, 32000, 128256), dtype=("fp32", "bf16"))


def chain_cases(full: bool) -> list[Case]:
    if full:
        grid = itertools.product(GRID_FULL["batch"], GRID_FULL["k"], GRID_FULL["vocab"], GRID_FULL["dtype"],
                                 CHAIN_MODES)  # fmt: skip
        cases = [Case("chain", *row) for row in grid]
        cases += [Case("lean", b, k, v, d, m) for b, k, v, d, m in itertools.product(
            (1, 4, 32), (1, 4, 8), (32000, 128256), ("fp32", "bf16"), ("greedy", "probs", "top_p"))]  # fmt: skip
        return cases
    return [
        Case("chain", 1, 4, 128256, "bf16", "greedy"),  # the audit's batch-1 spill (Triton 3.6)
        Case("chain", 1, 1, 32000, "fp32", "onehot"),  # K=1 without draft probabilities: the larger spill
        Case("chain", 1, 8, 128256, "fp32", "probs"),
        Case("chain", 4, 4, 4096, "bf16", "ragged_greedy"),  # prompt lookup at the synthetic pair's vocabulary
        Case("chain", 4, 8, 32000, "bf16", "top_p"),
        Case("chain", 32, 4, 128256, "fp32", "top_k"),
        Case("chain", 32, 8, 128256, "bf16", "probs"),
        Case("lean", 1, 4, 128256, "bf16", "greedy"),
        Case("lean", 8, 4, 128256, "fp32", "probs"),
    ]


def tree_cases(full: bool) -> list[Case]:
    if full:
        grid = itertools.product((1, 4, 32), (4, 8), (4096, 32000, 128256), ("fp32", "bf16"),
                                 ("greedy", "probs", "onehot", "top_k", "top_p"))  # fmt: skip
        cases = [Case("tree", *row) for row in grid]
        cases += [Case("mask", b, n, p, d, m) for b, n, p, d, m in itertools.product(
            (1, 4, 32), (8, 16, 32, 64), (100, 2000), ("fp32", "bf16"), ("prefix_mask", "prefix_len"))]  # fmt: skip
        return cases
    return [
        Case("tree", 1, 4, 32000, "bf16", "greedy"),
        Case("tree", 4, 4, 128256, "fp32", "top_k"),
        Case("tree", 1, 8, 4096, "fp32", "probs"),
        Case("mask", 1, 16, 600, "bf16", "prefix_mask"),
        Case("mask", 4, 64, 2000, "fp32", "prefix_len"),
    ]


_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _sampling(mode: str) -> dict:
    if mode.endswith("greedy"):
        return dict(temperature=0.0)
    if mode == "top_k":
        return dict(temperature=0.7, top_k=50)
    if mode == "top_p":
        return dict(temperature=0.7, top_p=0.9)
    return dict(temperature=1.0)


def run_case(case: Case) -> None:
    """Call the case's host wrapper on CPU tensors (never read: `torch.empty`), as `generate` and the benchmarks do:
    int64 drafts and fp32 draft probabilities from `generate`, int32 drafts and `out=` through the lean launcher."""
    from fastspec.kernels.chain_verifier import ChainVerifier
    from fastspec.kernels.tree_mask import tree_mask
    from fastspec.kernels.verify_chain import verify_chain
    from fastspec.kernels.verify_tree import verify_tree

    b, k, v, dtype = case.batch, case.k, case.vocab, _DTYPES[case.dtype]
    sampling = _sampling(case.mode)
    probs = case.mode in ("probs", "top_k", "top_p")
    if case.family == "mask":
        parents = torch.empty(b, k, dtype=torch.int64)
        prefix = torch.empty(b, v, dtype=torch.int64) if case.mode == "prefix_mask" else v
        tree_mask(parents, prefix, dtype)
    elif case.family == "tree":
        n = 2 * k  # nodes of a tree of depth D: at least D + 1
        verify_tree(torch.empty(b, n, v, dtype=dtype), torch.empty(b, n, dtype=torch.int64),
                    torch.empty(b, n, dtype=torch.int64), torch.empty(b, n, v) if probs else None,
                    uniforms=torch.empty(b, n), noise=torch.empty(b, v), max_depth=k, **sampling)  # fmt: skip
    elif case.family == "lean":
        verifier = ChainVerifier(b, k, v, dtype=dtype, device="cpu", draft_probs=probs, **sampling)
        verifier(torch.empty(b, k + 1, v, dtype=dtype), torch.empty(b, k, dtype=torch.int32),
                 torch.empty(b, k, v, dtype=dtype) if probs else None, uniforms=torch.empty(b, k),
                 noise=torch.empty(b, v), out=verifier.new_outputs())  # fmt: skip
    else:
        ragged = case.mode.startswith("ragged")
        verify_chain(torch.empty(b, k + 1, v, dtype=dtype), torch.empty(b, k, dtype=torch.int64),
                     torch.empty(b, k, v) if probs else None, torch.empty(b, dtype=torch.int64) if ragged else None,
                     uniforms=torch.empty(b, k), noise=torch.empty(b, v), **sampling)  # fmt: skip


# ----------------------------------------------------------------------------------- the stand-in GPU driver


class _StandInDriver:
    """What `JITFunction.run` asks Triton's driver before it compiles: the current device (one per architecture
    here, so each architecture gets its own binder), stream and target."""

    def __init__(self):
        self.capability = 90

    def get_current_device(self):
        return self.capability

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", self.capability, 32)


def collect(cases: list[Case], arches: list[str]) -> tuple[list[Spec], list[str]]:
    """Run every case's host code once per architecture; returns the distinct specialisations (in first-seen
    order) and the host errors (a case whose host code raised)."""
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    from fastspec.kernels import _host, tree_mask

    if _host.INTERPRETED:
        raise RuntimeError("the kernels were defined under Triton's interpreter: run this in a fresh process with "
                           "TRITON_INTERPRET unset")  # fmt: skip
    stand_in = _StandInDriver()
    driver.set_active(stand_in)
    _host.check_device = tree_mask.check_device = lambda device: None
    specs: dict[tuple, Spec] = {}
    errors = []
    current: list = []

    def intercept(self, key, signature, device, constexprs, options, attrs, warmup):
        _, _, target, _, _ = self.device_caches[device]
        arch, case = current
        spec = specs.get((self.__name__, arch, key))
        if spec is None:
            spec = Spec(self.__name__, arch, self.ASTSource(self, signature, constexprs, attrs), options.__dict__,
                        target)  # fmt: skip
            specs[(self.__name__, arch, key)] = spec
        spec.cases.append(case)
        return None  # nothing is launched

    JITFunction._do_compile = intercept
    for arch in arches:
        stand_in.capability, sms = ARCHES[arch]
        _host._num_sms = lambda index, sms=sms: sms
        from fastspec.kernels import verify_chain as verify_chain_module

        verify_chain_module._VERIFIERS.clear()  # built for the previous architecture's grid
        for case in cases:
            current[:] = [arch, case]
            try:
                run_case(case)
            except Exception as error:  # noqa: BLE001 - reported, the others go on
                errors.append(f"{arch} {case.label}: host code raised {type(error).__name__}: {error}")
    return list(specs.values()), errors


# ---------------------------------------------------------------------------------------- compile and ptxas

_SPECS: list[Spec] = []  # read by the forked workers


def _ptxas_command(arch: int) -> list[str]:
    """The installed Triton's ptxas for `arch` and the flags its `make_cubin` passes that change the allocation."""
    from triton.backends.nvidia import compiler

    tool = compiler.get_ptxas(arch)
    flags = ["-lineinfo", "-v"]
    if "--regAllocOptLevel=2" in inspect.getsource(compiler.CUDABackend.make_cubin):
        flags.append("--regAllocOptLevel=2")
    return [tool.path, *flags]


def parse_ptxas(log: str) -> dict:
    """Registers, stack, spill stores/loads and static shared memory from `ptxas -v` output (one kernel)."""

    def number(pattern):
        match = re.search(pattern, log)
        return int(match.group(1)) if match else 0

    return dict(
        registers=number(r"Used (\d+) registers"),
        stack=number(r"(\d+) bytes stack frame"),
        spill_stores=number(r"(\d+) bytes spill stores"),
        spill_loads=number(r"(\d+) bytes spill loads"),
        static_smem=number(r"(\d+) bytes smem"),
    )


def compile_one(index: int) -> dict:
    spec = _SPECS[index]
    row = dict(kernel=spec.kernel, arch=spec.arch, variant=spec.describe(), hot=spec.hot,
               cases=[c.label for c in spec.cases])  # fmt: skip
    start = time.perf_counter()
    try:
        compiled = triton.compile(spec.source, target=spec.target, options=spec.options)
        ptx = compiled.asm["ptx"]
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "kernel.ptx"
            path.write_text(ptx)
            cmd = _ptxas_command(spec.target.arch) + [f"--gpu-name={spec.arch}", str(path), "-o", str(path) + ".o"]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"ptxas failed ({proc.returncode}): {proc.stderr[-2000:]}")
        stats = parse_ptxas(proc.stderr + proc.stdout)
        metadata = compiled.metadata
        shared = getattr(metadata, "shared", 0) or 0
        row.update(stats, smem=shared + stats["static_smem"], ptx_version=re.search(r"\.version (\S+)", ptx).group(1),
                   ptxas=Path(cmd[0]).name, printf="vprintf" in ptx, asserts="__assertfail" in ptx,
                   global_scratch=getattr(metadata, "global_scratch_size", 0) or 0)  # fmt: skip
    except Exception as error:  # noqa: BLE001 - a compile error is a result
        row["error"] = f"{type(error).__name__}: {str(error)[-3000:]}"
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def compile_all(specs: list[Spec], jobs: int) -> list[dict]:
    _SPECS[:] = specs
    if jobs <= 1 or len(specs) <= 1:
        return [compile_one(i) for i in range(len(specs))]
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        return pool.map(compile_one, range(len(specs)), chunksize=1)


def device_check(specs: list[Spec], rows: list[dict]) -> None:
    """On a CUDA machine: load the binaries of the device's architecture and add the driver's register and
    local-memory (spill) counts to their rows. In this process, after the forked compiles (CUDA is not forked)."""
    from triton.runtime.driver import driver

    major, minor = torch.cuda.get_device_capability()
    driver.reset_active()
    for spec, row in zip(specs, rows, strict=True):
        if "error" in row or spec.target.arch != 10 * major + minor:
            continue
        try:
            compiled = triton.compile(spec.source, target=spec.target, options=spec.options)  # Triton's cache
            compiled._init_handles()
            row.update(device_registers=compiled.n_regs, device_spills=compiled.n_spills)
        except Exception as error:  # noqa: BLE001 - reported in the row
            row["device_error"] = f"{type(error).__name__}: {str(error)[-500:]}"


def problems(rows: list[dict], host_errors: list[str]) -> list[str]:
    """What fails the check: host errors, compile errors, printf/assert left in, spills in hot variants."""
    found = list(host_errors)
    for r in rows:
        where = f"{r['kernel']} {r['arch']} [{r['variant']}] ({r['cases'][0]})"
        if "error" in r:
            found.append(f"{where}: compile error: {r['error']}")
            continue
        if r["printf"] or r["asserts"]:
            found.append(f"{where}: printf/assert left in the PTX")
        if r["hot"] and (r["spill_stores"] or r["spill_loads"]):
            spills = f"{r['spill_stores']} bytes stores / {r['spill_loads']} loads"
            found.append(f"{where}: spills {spills} in a hot variant")
        if r["hot"] and r.get("device_spills"):
            found.append(f"{where}: {r['device_spills']} bytes of local memory as loaded on the device (hot variant)")
    return found


def markdown(rows: list[dict], header: dict) -> str:
    lines = [
        f"# Triton kernels compiled for GPUs: triton {header['triton']}, torch {header['torch']}",
        "",
        f"`{header['command']}` ({header['grid']} grid, {header['seconds']:.0f} s on {header['host']}, Triton's "
        "cache as it was). One row per "
        "distinct specialisation and architecture that the host wrappers produce at the listed shapes; "
        "registers, stack and spill bytes from `ptxas -v` (the ptxas this Triton uses for the architecture), "
        "shared memory = Triton's dynamic allocation + static. Hot = produced by a case with batch <= 8 and "
        "K (or tree depth) <= 8: no spill allowed there.",
        "",
        "| kernel | arch | variant | hot | registers | smem B | stack B | spill st/ld B | ptxas | PTX | compile s | "
        "first case (of n) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['kernel']} | {r['arch']} | {r['variant']} | {r['hot']} | error | | | | | | "
                         f"{r['seconds']} | {r['cases'][0]} ({len(r['cases'])}) |")  # fmt: skip
            continue
        lines.append(
            f"| {r['kernel']} | {r['arch']} | {r['variant']} | {'yes' if r['hot'] else ''} | {r['registers']} | "
            f"{r['smem']} | {r['stack']} | {r['spill_stores']}/{r['spill_loads']} | {r['ptxas']} | {r['ptx_version']} "
            f"| {r['seconds']} | {r['cases'][0]} ({len(r['cases'])}) |"
        )
    return "\n".join(lines) + "\n"


def unavailable() -> str | None:
    """Why this Triton cannot compile for NVIDIA GPUs here, or None."""
    try:
        from triton.backends.nvidia import compiler
    except ImportError as error:
        return f"triton {triton.__version__} has no NVIDIA backend ({error})"
    for arch in (80, 90):
        try:
            path = compiler.get_ptxas(arch).path
        except Exception as error:  # noqa: BLE001 - knobs raise when the tool is missing
            return f"triton {triton.__version__}: no ptxas for sm_{arch} ({type(error).__name__}: {error})"
        if not path or not os.access(path, os.X_OK):
            return f"triton {triton.__version__}: ptxas for sm_{arch} not found ({path})"
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", default=os.environ.get("FASTSPEC_COMPILE_FULL") == "1",
                        help="the whole grid (default: a representative set; env FASTSPEC_COMPILE_FULL=1)")  # fmt: skip
    parser.add_argument("--arch", nargs="+", choices=list(ARCHES), default=list(ARCHES))
    parser.add_argument("--families", nargs="+", choices=("chain", "lean", "tree", "mask"),
                        default=["chain", "lean", "tree", "mask"])  # fmt: skip
    parser.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--json", type=Path, help="write the rows and problems here")
    parser.add_argument("--markdown", type=Path, help="write the table here")
    parser.add_argument("--write-results", action="store_true",
                        help="write bench/results/compile_table_<triton version>.md")  # fmt: skip
    args = parser.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)  # before the kernels are defined: real JIT functions

    reason = unavailable()
    if reason is not None:
        print(f"skip: {reason}")
        if args.json:
            args.json.write_text(json.dumps(dict(skipped=reason)))
        return SKIP
    start = time.perf_counter()
    cases = [c for c in chain_cases(args.full) + tree_cases(args.full) if c.family in args.families]
    specs, host_errors = collect(cases, args.arch)
    print(f"{len(cases)} cases x {len(args.arch)} architectures -> {len(specs)} specialisations; compiling with "
          f"{args.jobs} processes (triton {triton.__version__})", flush=True)  # fmt: skip
    rows = compile_all(specs, args.jobs)
    if torch.cuda.is_available():
        device_check(specs, rows)
    found = problems(rows, host_errors)
    seconds = time.perf_counter() - start
    grid = "full" if args.full else "representative"
    python = os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(str(ROOT)) else sys.executable
    command = f"PYTHONPATH=. {python} bench/kernels/compile_table.py" + (" --full" if args.full else "")
    header = dict(
        triton=triton.__version__,
        torch=torch.__version__,
        grid=grid,
        seconds=seconds,
        command=command,
        host=f"{os.cpu_count()} CPU cores, no GPU" if not torch.cuda.is_available() else "a CUDA machine",
    )
    table = markdown(rows, header)
    print(table)
    if args.json:
        args.json.write_text(json.dumps(dict(header=header, rows=rows, problems=found), indent=1))
    if args.markdown:
        args.markdown.write_text(table)
    if args.write_results:
        path = ROOT / "bench" / "results" / f"compile_table_{triton.__version__}.md"
        path.write_text(table)
        print(f"wrote {path}")
    for line in found:
        print(f"FAIL {line}")
    print(f"{len(rows)} specialisations compiled in {seconds:.0f} s, {len(found)} problems")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
