"""A seeded synthetic agentic workload whose CPU cost depends on the job's features.

Each trajectory: an optional cheap ``lookup`` call (50%), a ``crunch`` call (the "first evaluation"),
a second ``crunch`` of nearly the same input on ``--repair-fraction`` of trajectories (the "repair"),
then a graded answer. ``crunch(data, factor)`` busy-loops on the worker for
``len(data) / 1024 × ms_per_kb × factor`` milliseconds: its cost follows its input size (heavy-tailed,
lognormal σ = ``--cpu-sigma``), which a predictor can see (argument bytes), times a noise ``factor``
(lognormal σ = ``--noise``) it cannot. Model turns take lognormal ``latency_ms`` around ``--model-ms``
(σ 0.5). Every tool action also declares ``cpu_ms`` (its true cost) so ``asyncroll simulate`` reproduces
what ``asyncroll run`` does for real. The tools live in ``synthetic_tools.py`` beside the workload.

Every action also declares ``output_tokens``: its latency divided by the batching server model's default
decode step at batch 1 (``step_base_ms + step_per_seq_ms`` ≈ 12.1 ms), so that ``--server batching``
decodes each turn for about its scripted latency when alone and slower in a full batch. (Without it the
batching model would count the action's size, multi-KB ``data`` arguments included, as output tokens.)

Run: ``python -m bench.synthetic --n 200 --model-ms 400 --cpu-ms 300 --seed 0 --output W.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
from pathlib import Path
from typing import Any

from asyncroll.backends.server_model import ServerModelConfig
from asyncroll.workload import MAX_DURATION_MS
from bench.common import number_arg, run_main

MS_PER_KB = 20.0
#: The largest mean crunch cost: its input is len = cpu_ms / MS_PER_KB KB of text (a minute: 3 MB per job).
MAX_CPU_MS = 60_000.0
#: The largest mean model latency: a workload's bound on one declared duration (one day).
MAX_MODEL_MS = float(MAX_DURATION_MS)
#: The largest lognormal sigma (beyond it nearly every draw is ~0 and a few overflow).
MAX_SIGMA = 5.0
_DEFAULT_SERVER = ServerModelConfig()
DECODE_STEP_MS = _DEFAULT_SERVER.step_base_ms + _DEFAULT_SERVER.step_per_seq_ms
TOOLS_FILE = "synthetic_tools.py"
TOOLS_SOURCE = '''"""Tools of the bench.synthetic workload: real CPU work that follows the input size."""

import time


def crunch(data: str, factor: float, ms_per_kb: float) -> int:
    """Busy-loop for len(data) / 1024 × ms_per_kb × factor milliseconds; return the input length."""
    deadline = time.perf_counter() + len(data) / 1024 * ms_per_kb * factor / 1000
    while time.perf_counter() < deadline:
        pass
    return len(data)


def lookup(key: str) -> str:
    """A cheap tool: about 2 ms of CPU."""
    deadline = time.perf_counter() + 0.002
    while time.perf_counter() < deadline:
        pass
    return key[::-1]
'''
TOOLS = [
    {
        "name": "crunch",
        "description": "Check a candidate against the data.",
        "inputs": {"data": "str", "factor": "float", "ms_per_kb": "float"},
        "implementation": TOOLS_FILE,
        "bound_arguments": {"ms_per_kb": MS_PER_KB},
    },
    {
        "name": "lookup",
        "description": "Look a key up.",
        "inputs": {"key": "str"},
        "implementation": TOOLS_FILE,
    },
]


def _lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    return mean * math.exp(rng.gauss(-sigma * sigma / 2, sigma))


def make(
    n: int,
    model_ms: float,
    cpu_ms: float,
    seed: int,
    *,
    cpu_sigma: float = 1.0,
    noise: float = 0.3,
    repair_fraction: float = 0.6,
) -> list[dict[str, Any]]:
    rng = random.Random(seed)

    def model() -> dict[str, Any]:
        latency = round(_lognormal(rng, model_ms, 0.5), 3)
        return {"latency_ms": latency, "output_tokens": max(1, round(latency / DECODE_STEP_MS))}

    def crunch(size: int) -> dict[str, Any]:
        factor = round(_lognormal(rng, 1.0, noise), 4)
        cost = size / 1024 * MS_PER_KB * factor
        return {
            "type": "tool",
            "name": "crunch",
            "arguments": {"data": "x" * size, "factor": factor},
            **model(),
            "cpu_ms": round(cost, 3),
        }

    problems = []
    for i in range(n):
        script: list[dict[str, Any]] = []
        if rng.random() < 0.5:
            script.append(
                {
                    "type": "tool",
                    "name": "lookup",
                    "arguments": {"key": f"k{i}"},
                    **model(),
                    "cpu_ms": 2.0,
                }
            )
        mean_size = cpu_ms / MS_PER_KB * 1024
        size = max(16, min(int(_lognormal(rng, mean_size, cpu_sigma)), int(20 * mean_size)))
        script.append(crunch(size))
        if rng.random() < repair_fraction:
            script.append(crunch(max(16, int(size * rng.uniform(0.8, 1.2)))))
        script.append({"type": "final", "answer": str(i), **model()})
        problems.append(
            {
                "id": f"syn-{i}",
                "prompt": f"synthetic task {i}",
                "tools": TOOLS,
                "reference_answer": str(i),
                "script": script,
            }
        )
    return problems


def write(path: Path, n: int, model_ms: float, cpu_ms: float, seed: int, **kw: Any) -> Path:
    """Write the workload to ``path`` and its tools file beside it.

    An existing tools file is left alone if it is exactly this one and refused (``FileExistsError``,
    before anything is written) if it is not: it may be another workload's."""
    tools = path.parent / TOOLS_FILE
    if tools.exists() and (not tools.is_file() or tools.read_bytes() != TOOLS_SOURCE.encode()):
        raise FileExistsError(
            f"{tools} exists and is not this generator's tools file; choose another output folder"
        )
    problems = make(n, model_ms, cpu_ms, seed, **kw)
    longest = max(a.get(k, 0.0) for p in problems for a in p["script"] for k in ("latency_ms", "cpu_ms"))
    if longest > MAX_DURATION_MS:
        raise ValueError(
            f"these parameters draw a duration of {longest:.0f} ms, over a workload's one-day limit; "
            "lower --model-ms, --cpu-ms, --cpu-sigma or --noise"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    made_tools = not tools.exists()
    # Written beside it under another name, then renamed: a Ctrl-C or a full disk midway left the lines
    # written so far as the workload (cut at a line's end, a smaller valid one), and the tools file.
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        if made_tools:
            tools.write_text(TOOLS_SOURCE)
        with partial.open("x") as handle:
            for problem in problems:
                handle.write(json.dumps(problem) + "\n")
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        if made_tools:
            tools.unlink(missing_ok=True)
        raise
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=number_arg(int, 1, 10_000_000), default=200, help="trajectories (>= 1)")
    parser.add_argument(
        "--model-ms",
        type=number_arg(float, 0, MAX_MODEL_MS),
        default=400.0,
        help="mean model latency per turn (>= 0)",
    )
    parser.add_argument(
        "--cpu-ms",
        type=number_arg(float, 0, MAX_CPU_MS, low_open=True),
        default=300.0,
        help=f"mean cost of a crunch job (> 0, at most {MAX_CPU_MS:g}: its input is 51 bytes per ms)",
    )
    sigma = number_arg(float, 0, MAX_SIGMA)
    parser.add_argument("--cpu-sigma", type=sigma, default=1.0, help="lognormal sigma of crunch input sizes")
    parser.add_argument("--noise", type=sigma, default=0.3, help="lognormal sigma of the hidden cost factor")
    parser.add_argument(
        "--repair-fraction",
        type=number_arg(float, 0, 1),
        default=0.6,
        help="trajectories with a repair (0 to 1)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.output.exists() or args.output.is_symlink():
        parser.error(f"--output {args.output} already exists; choose a new file (nothing is overwritten)")
    try:
        write(
            args.output,
            args.n,
            args.model_ms,
            args.cpu_ms,
            args.seed,
            cpu_sigma=args.cpu_sigma,
            noise=args.noise,
            repair_fraction=args.repair_fraction,
        )
    except ValueError as exc:
        parser.error(str(exc))
    except OSError as exc:  # the refused tools file (its own message), or a folder that cannot be made
        parser.error(str(exc) if exc.errno is None else f"cannot write --output {args.output}: {exc}")
    print(f"wrote {args.n} problems to {args.output} and {args.output.parent / TOOLS_FILE}")


if __name__ == "__main__":
    run_main("bench.synthetic", main, "no workload written")
