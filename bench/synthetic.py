"""A seeded synthetic agentic workload with realistic shape, runnable for real and in simulation.

Each trajectory makes 1 tool call (40%) or 2 (60%: a first attempt and a "repair"), then answers; the
answer is graded (a grade job). Model turns take a lognormal ``latency_ms`` around ``--model-ms``
(sigma 0.5); tool calls are ``spin_ms`` busy loops with heavy-tailed lognormal lengths around
``--cpu-ms`` (sigma 1.0, capped at 20×). The same file runs with ``asyncroll run`` (real workers spin)
and ``asyncroll simulate`` (the spin argument is the job's duration).

Run: ``python -m bench.synthetic --n 200 --model-ms 400 --cpu-ms 300 --seed 0 --output W.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path
from typing import Any


def _lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    return mean * math.exp(rng.gauss(-sigma * sigma / 2, sigma))


def make(n: int, model_ms: float, cpu_ms: float, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    problems = []
    for i in range(n):
        calls = 2 if rng.random() < 0.6 else 1
        script: list[dict[str, Any]] = []
        for _ in range(calls):
            spin = min(_lognormal(rng, cpu_ms, 1.0), 20 * cpu_ms)
            script.append({"type": "tool", "name": "spin_ms", "arguments": {"milliseconds": round(spin, 3)},
                           "latency_ms": round(_lognormal(rng, model_ms, 0.5), 3)})
        final_ms = round(_lognormal(rng, model_ms, 0.5), 3)
        script.append({"type": "final", "answer": str(i), "latency_ms": final_ms})
        problems.append({"id": f"syn-{i}", "prompt": f"synthetic task {i}", "tools": [{"name": "spin_ms"}],
                         "reference_answer": str(i), "script": script})
    return problems


def write(path: Path, n: int, model_ms: float, cpu_ms: float, seed: int) -> Path:
    path.write_text("".join(json.dumps(p) + "\n" for p in make(n, model_ms, cpu_ms, seed)))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--model-ms", type=float, default=400.0)
    parser.add_argument("--cpu-ms", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    write(args.output, args.n, args.model_ms, args.cpu_ms, args.seed)
    print(f"wrote {args.n} problems to {args.output}")


if __name__ == "__main__":
    main()
