"""Host side shared by the Triton kernel wrappers: Triton's mode, argument checks, sampling parameters as kernel
arguments, the tile choices and `Launcher` (launches that skip Triton's per-call dispatch). Nothing here reads a
tensor value (no host synchronisation).

`INTERPRETED` is fixed when this module is first imported, i.e. when `fastspec.kernels`' Triton modules are first
imported (`fastspec.verify` does that on the first kernel call): set TRITON_INTERPRET=1 before that to run the
kernels on CPU tensors through Triton's interpreter.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton

from fastspec.kernels.sampling import min_p_log
from fastspec.kernels.sampling_filters import _PIVOTS, _order_key

# kernels defined while TRITON_INTERPRET=1 are interpreter functions, not JIT functions; every kernel module is
# defined right after this one, so one jitted function tells for all of them
INTERPRETED = not isinstance(_order_key, triton.runtime.JITFunction)

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_INTS = (torch.int32, torch.int64)
_PARAM_FLOATS = _FLOATS + (torch.float64,)


def _check_tensor(x, name: str, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...], device: torch.device):
    """x: a tensor of `shape`, one of `dtypes`, on `device`; the errors name the argument."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(x.shape)}")
    if x.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {x.dtype}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but target_logits is on {device}")


def expect(x, name: str, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...], device_index: int) -> tuple[int, ...]:
    """The per-call check of a lean verifier (`ChainVerifier`): x is a tensor of `shape` (at least 1-d), one of
    `dtypes`, on the device `device_index` (`Tensor.get_device()`: -1 for the CPU), with unit stride along its
    last axis. Returns x.stride(). A microsecond when it holds; the errors name the argument, as `_check_tensor`'s."""
    try:
        if x.shape == shape and x.dtype in dtypes and x.get_device() == device_index:
            strides = x.stride()
            if strides[-1] == 1 or shape[-1] <= 1:
                return strides
            raise ValueError(f"{name} must have unit stride along its last axis, got strides {list(strides)}")
    except AttributeError:  # not a tensor: said below
        pass
    device = torch.device("cpu") if device_index < 0 else torch.device("cuda", device_index)
    _check_tensor(x, name, shape, dtypes, device)
    raise ValueError(f"{name} is on {x.device}, expected {device}")


def check_logits(target_logits, layout: str) -> None:
    """target_logits: a float tensor of `layout` (e.g. "[B, N, V] with N >= 1") with fewer than 2**31 - 1 tokens."""
    if not isinstance(target_logits, torch.Tensor):
        raise TypeError(f"target_logits must be a torch.Tensor, got {type(target_logits).__name__}")
    if target_logits.dim() != 3 or target_logits.shape[1] < 1 or target_logits.shape[2] < 1:
        raise ValueError(f"target_logits must have shape {layout}, got {list(target_logits.shape)}")
    if target_logits.dtype not in _FLOATS:
        raise ValueError(f"target_logits must have dtype in {[str(d) for d in _FLOATS]}, got {target_logits.dtype}")
    if target_logits.shape[2] >= 2**31 - 1:
        raise ValueError(f"target_logits vocabulary must be < 2**31 - 1, got {target_logits.shape[2]}")


def check_index(x, name: str, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """An int32/int64 tensor of `shape` (tokens, parents, draft counts), with unit stride along its last axis."""
    _check_tensor(x, name, shape, _INTS, device)
    return unit_stride(x)


def unit_stride(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def ptr(x: torch.Tensor | None, stand_in: torch.Tensor) -> torch.Tensor:
    """x, or a never-read stand-in for an unused (None) or empty argument: a kernel needs a tensor in every slot."""
    return x if x is not None and x.numel() > 0 else stand_in


def _row_param_arg(
    value, name: str, batch: int, device: torch.device, dtype: torch.dtype, dtypes: tuple[torch.dtype, ...]
):
    """(tensor [B] or None, scalar) for a sampling parameter given as a Python number or a [B] tensor; the tensor
    (one of `dtypes`) is converted to `dtype`."""
    if not isinstance(value, torch.Tensor):
        return None, value
    if value.dim() > 1 or value.numel() not in (1, batch):
        raise ValueError(f"{name} must be a number or a [B] = [{batch}] tensor, got shape {list(value.shape)}")
    if value.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {value.dtype}")
    if value.device != device:
        raise ValueError(f"{name} is on {value.device} but target_logits is on {device}")
    return value.reshape(-1).expand(batch).to(dtype).contiguous(), 0


@dataclass(frozen=True)
class SamplingArgs:
    """Temperature, top-k, top-p and min-p as kernel arguments: a [B] tensor for a parameter given per row (its
    scalar slot then unused), else the scalar (its tensor slot then holds a never-read stand-in). Min-p is passed as
    log(min_p) (`fastspec.kernels.sampling.min_p_log`).

    top-k / top-p / min-p are compiled in (`has_top_k`, `has_top_p`, `has_min_p`) only when some row can drop a
    token: never for an all-greedy batch (scalar temperature 0), nor for a scalar top_k <= 0 or >= V, a scalar
    top_p >= 1, or a scalar min_p None or 0.
    """

    temperature: torch.Tensor | None
    temperature_value: float
    top_k: torch.Tensor | None
    top_k_value: int
    top_p: torch.Tensor | None
    top_p_value: float
    has_top_k: bool
    has_top_p: bool
    min_p: torch.Tensor | None = None  # [B] fp32 log(min_p) per row
    min_p_value: float = float("-inf")  # log(min_p) of every row
    has_min_p: bool = False

    @property
    def has_filter(self) -> bool:
        return self.has_top_k or self.has_top_p or self.has_min_p

    def temperature_args(self, stand_in: torch.Tensor) -> tuple:
        """(temp_ptr, temp_value) kernel arguments."""
        return ptr(self.temperature, stand_in), self.temperature_value

    def filter_args(self, stand_in: torch.Tensor) -> tuple:
        """(top_k_ptr, top_k_value, top_p_ptr, top_p_value, min_p_ptr, min_p_value) kernel arguments."""
        return ptr(self.top_k, stand_in), self.top_k_value, ptr(self.top_p, stand_in), self.top_p_value, \
            ptr(self.min_p, stand_in), self.min_p_value  # fmt: skip

    def flags(self) -> dict[str, bool]:
        """TEMP_PER_ROW and the filter flags (HAS_TOP_K, TOP_K_PER_ROW, HAS_TOP_P, TOP_P_PER_ROW, HAS_MIN_P,
        MIN_P_PER_ROW) of a kernel."""
        return dict(
            self.temperature_flags(),
            HAS_TOP_K=self.has_top_k,
            TOP_K_PER_ROW=self.top_k is not None,
            HAS_TOP_P=self.has_top_p,
            TOP_P_PER_ROW=self.top_p is not None,
            HAS_MIN_P=self.has_min_p,
            MIN_P_PER_ROW=self.min_p is not None,
        )

    def temperature_flags(self) -> dict[str, bool]:
        return dict(TEMP_PER_ROW=self.temperature is not None)


def sampling_args(temperature, top_k, top_p, batch: int, vocab: int, device: torch.device,
                  min_p=None) -> SamplingArgs:  # fmt: skip
    """Check temperature (>= 0, or [B] float), top_k (int or [B] int), top_p ((0, 1], or [B] float) and min_p
    ([0, 1], or [B] float) and turn them into kernel arguments; per-row tensors are not read (their values are the
    kernels' business: a [B] min_p becomes its log on the device, without a sync)."""
    temp_t, temp_v = _row_param_arg(temperature, "temperature", batch, device, torch.float32, _PARAM_FLOATS)
    k_t, k_v = _row_param_arg(top_k, "top_k", batch, device, torch.int32, _INTS)
    p_t, p_v = _row_param_arg(top_p, "top_p", batch, device, torch.float32, _PARAM_FLOATS)
    m_t, m_v = _row_param_arg(min_p, "min_p", batch, device, torch.float32, _PARAM_FLOATS)
    if temp_t is None and not temp_v >= 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temp_v}")
    if p_t is None and p_v is not None and not 0 < p_v <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {p_v}")
    if m_t is None and m_v is not None and not 0 <= m_v <= 1:
        raise ValueError(f"min_p must be in [0, 1], got {m_v}")
    sampled = temp_t is not None or temp_v > 0  # greedy rows ignore top-k, top-p and min-p
    has_top_k = sampled and (k_t is not None or (k_v is not None and 0 < k_v < vocab))
    has_top_p = sampled and (p_t is not None or (p_v is not None and p_v < 1.0))
    has_min_p = sampled and (m_t is not None or (m_v is not None and m_v > 0))
    return SamplingArgs(
        temp_t, float(temp_v), k_t, int(k_v or 0), p_t, 1.0 if p_v is None else float(p_v), has_top_k, has_top_p,
        None if m_t is None else min_p_log(m_t), min_p_log(m_v) if m_v is not None else float("-inf"), has_min_p,
    )  # fmt: skip


class VerifyArgs(NamedTuple):
    """The checked inputs shared by chain and tree verification (see `check_verify_args`)."""

    target_logits: torch.Tensor  # [B, N, V], unit stride along V
    draft_probs: torch.Tensor | None  # [B, M, V], unit stride along V
    uniforms: torch.Tensor  # [B, M] fp32
    noise: torch.Tensor  # [B, V] fp32
    sampling: SamplingArgs


def check_verify_args(target_logits: torch.Tensor, draft_probs, uniforms, noise, temperature, top_k, top_p,
                      positions: int, min_p=None) -> VerifyArgs:  # fmt: skip
    """Check the arguments both verifiers take, given target_logits [B, N, V] already checked (`check_logits`):
    draft_probs [B, M, V] float or None, uniforms [B, M] and noise [B, V] float (fp64 is rounded to fp32), the
    sampling parameters (`sampling_args`, min_p included), with M = `positions` (K draft positions, or N tree
    nodes)."""
    batch, _, vocab = target_logits.shape
    device = target_logits.device
    if draft_probs is not None:
        _check_tensor(draft_probs, "draft_probs", (batch, positions, vocab), _FLOATS, device)
        draft_probs = unit_stride(draft_probs)
    _check_tensor(uniforms, "uniforms", (batch, positions), _PARAM_FLOATS, device)
    _check_tensor(noise, "noise", (batch, vocab), _PARAM_FLOATS, device)
    sampling = sampling_args(temperature, top_k, top_p, batch, vocab, device, min_p)
    return VerifyArgs(
        unit_stride(target_logits), draft_probs, unit_stride(uniforms.float()), unit_stride(noise.float()), sampling
    )


# ------------------------------------------------------------------------------------------------ tile choices


@dataclass(frozen=True)
class Launch:
    """Tile budgets of where the kernels run: the interpreter pays per program (numpy vectorises big tiles), the
    GPU per register."""

    interpreted: bool
    tile: int  # elements of a [rows, V] block one program holds
    search_tile: int  # elements of a [rows, P, V] block of one pivot pass
    min_programs: int  # programs that keep the device busy


def check_device(device: torch.device) -> None:
    """RuntimeError unless Triton can run on `device`: CUDA, or any device under the interpreter."""
    if not INTERPRETED and device.type != "cuda":
        raise RuntimeError(
            f"the inputs are on {device}: the Triton kernels need CUDA, or TRITON_INTERPRET=1 set before the first "
            "kernel call (before fastspec.kernels' Triton modules are imported)"
        )


def launch_for(device: torch.device) -> Launch:
    """The tile budgets for tensors on `device` (`check_device` first)."""
    check_device(device)
    if INTERPRETED:
        return Launch(True, tile=2**17, search_tile=2**19, min_programs=4)
    return Launch(False, tile=8192, search_tile=8192, min_programs=4 * _num_sms(device.index or 0))


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def chunk_tiles(rows: int, vocab: int, max_block_v: int, launch: Launch, max_chunks: int | None = None
                ) -> tuple[int, int]:  # fmt: skip
    """(rows per program, V chunk) of a (row tiles, V chunks) grid over a [rows, V] stream: whole rows packed into
    one program when V is small, else the largest V chunk (down to 1024) that still gives enough programs, but
    not so small that a row has more than `max_chunks` chunks (a reader of every chunk's statistics holds them in
    a [positions, chunks] tile)."""
    block_v = min(triton.next_power_of_2(vocab), max_block_v)
    while block_v > 1024 and rows * triton.cdiv(vocab, block_v) < launch.min_programs:
        if max_chunks is not None and triton.cdiv(vocab, block_v // 2) > max_chunks:
            break
        block_v //= 2
    block_r = max(1, min(launch.tile // block_v, triton.next_power_of_2(rows))) if block_v >= vocab else 1
    return block_r, block_v


def walk_tiles(rows: int, vocab: int, max_block_v: int, launch: Launch, pack: bool) -> tuple[int, int, int]:
    """(rows per program, V chunk, search chunk) of a kernel whose programs stream whole rows in V chunks and run
    the pivot search on [rows, P, search chunk] tiles. Under the interpreter a program takes many rows; on the GPU
    one, or with `pack` as many whole rows as fit one chunk."""
    block_v = min(triton.next_power_of_2(vocab), max_block_v)
    block_s = min(block_v, launch.search_tile // _PIVOTS.value)
    block_r = 1
    if launch.interpreted or (pack and block_v >= vocab):
        block_r = max(1, min(launch.search_tile // (_PIVOTS.value * block_s), triton.next_power_of_2(rows)))
    return block_r, block_v, block_s


def num_warps(elements: int) -> int:
    """Warps for a program whose largest tile has `elements` elements."""
    return 8 if elements >= 4096 else 4


def device_index(device: torch.device) -> int:
    """`Tensor.get_device()` of tensors on `device` (-1 for the CPU), the current CUDA device for a bare "cuda"."""
    if device.type != "cuda":
        return -1
    return torch.cuda.current_device() if device.index is None else device.index


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Triton's driver calls: no Stream object


def current_stream(index: int) -> int:
    """The raw handle of CUDA device `index`'s current stream (what Triton launches on); 0 for index -1 (CPU)."""
    if index < 0:
        return 0
    return _raw_stream(index) if _raw_stream is not None else torch.cuda.current_stream(index).cuda_stream


# ------------------------------------------------------------------------------------------------------ launches

_direct_launches = not INTERPRETED  # cleared (with a warning) if a direct launch ever fails


class Launcher:
    """Launches of one Triton kernel on a fixed grid, with fixed compile-time arguments and warps.

    `kernel[grid](...)` binds every argument, works out its specialisation (dtypes, 16-byte alignment of pointers,
    integers equal to 1 or divisible by 16) and hashes a cache key on each call: tens of microseconds of Python a
    launch. A `Launcher` does that once per `key`: the caller's description of everything in the runtime arguments
    Triton specialises on (their strides and the dtypes and alignments of their tensors; the fixed arguments are
    the caller's business). The first launch with a key goes through Triton's JIT, which compiles or finds the
    binary; later launches with that key call the compiled kernel's launcher (`CompiledKernel[grid]`, arguments
    in signature order, constexprs included, as Triton >= 3.3 passes them) directly. Under the interpreter, or with
    key None, every launch goes through Triton. Should a direct launch ever fail (a Triton whose launcher takes
    other arguments), it warns once and every later launch of any `Launcher` goes through the JIT.
    """

    _MAX_KEYS = 64  # distinct specialisations kept per launcher (strides that change every call would grow it)

    def __init__(self, kernel, grid: tuple[int, ...], warps: int, **constexprs):
        names = list(kernel.arg_names)
        trailing = names[len(names) - len(constexprs) :]
        if sorted(trailing) != sorted(constexprs):
            raise ValueError(f"{kernel}: constexprs {sorted(constexprs)} are not its trailing parameters {trailing}")
        self.kernel, self.warps = kernel, warps
        self.grid = tuple(grid) + (1,) * (3 - len(grid))  # `CompiledKernel[grid]` reads grid[0], grid[1], grid[2]
        self.constexprs = tuple(constexprs[name] for name in trailing)
        self.direct: dict = {}

    def __call__(self, key, *args) -> None:
        launch = self.direct.get(key) if _direct_launches else None
        if launch is not None:
            try:
                launch(*args, *self.constexprs)
                return
            except Exception as error:  # noqa: BLE001 - any launcher mismatch: back to Triton's own launch path
                _disable_direct_launches(error)
        compiled = self.kernel[self.grid](*args, *self.constexprs, num_warps=self.warps)
        if _direct_launches and key is not None and hasattr(compiled, "function"):
            if len(self.direct) >= self._MAX_KEYS:
                self.direct.clear()
            self.direct[key] = compiled[self.grid]


def _disable_direct_launches(error: Exception) -> None:
    global _direct_launches
    _direct_launches = False
    message = f"fastspec.kernels: a direct kernel launch failed ({type(error).__name__}: {error}); launching through"
    warnings.warn(message + " Triton's JIT from now on (slower host path, same results)", RuntimeWarning, stacklevel=3)
