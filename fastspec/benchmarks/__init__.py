"""fastspec's benchmark harness: what `fastspec bench` runs, and the public surface every script in bench/ uses.

- `grid` (`BenchConfig`, `run_bench`, `grid_rows`, `DEFAULT_SETTINGS`): `fastspec bench`, methods side by side on
  the shipped pair (or any target) over a grid of batch sizes and temperatures;
- `suite` (`SuiteConfig`, `run_suite`): `fastspec bench --suite spec`, a Spec-Bench-style suite per prompt category;
- `methods` (`method_table`, `load_heads`, `new_tokens`, `acceptance_summary`, `precompile`): the rows both time;
- `timing` (`interleave`, `measure`, `synchronize`, `Progress`): methods interleaved per input, medians of repeats,
  memory, device synchronisation, the progress line;
- `environment` (`environment`, `load_average`, `CompileCounter`): the record of the machine and software beside
  every result, and the step shapes compiled while a call ran;
- `report`: the markdown tables and JSON files of both.

The prompt sets are the library's (`fastspec.prompts`: held-out code of the shipped pair's corpus, MT-bench,
HumanEval), shared with training, which must stay disjoint from them. Nothing in the decoding library imports this
package.
"""

from fastspec.benchmarks.environment import CompileCounter, environment, load_average
from fastspec.benchmarks.grid import DEFAULT_SETTINGS, BenchConfig, grid_rows, run_bench
from fastspec.benchmarks.methods import acceptance_summary, new_tokens
from fastspec.benchmarks.suite import SuiteConfig, run_suite
from fastspec.benchmarks.timing import MethodTimes, Progress, interleave, measure, synchronize

__all__ = [
    "DEFAULT_SETTINGS",
    "BenchConfig",
    "CompileCounter",
    "MethodTimes",
    "Progress",
    "SuiteConfig",
    "acceptance_summary",
    "environment",
    "grid_rows",
    "interleave",
    "load_average",
    "measure",
    "new_tokens",
    "run_bench",
    "run_suite",
    "synchronize",
]
