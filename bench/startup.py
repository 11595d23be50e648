"""CLI start-up: wall time of ``asyncroll --help`` (target < 0.3 s), min/median/max over repeats.

Heavy imports (pydantic, psutil, httpx, scikit-learn, the runtime) load only inside commands; this
measures what a user waits for before any command runs. Run: ``python -m bench.startup [--repeats 15]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench.common import machine, number_arg, quantiles, run_child, run_main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=number_arg(int, 1, 1_000_000), default=15)
    args = parser.parse_args()
    # this interpreter's own script, not whichever asyncroll PATH finds first (another installation)
    exe = Path(sys.executable).with_name("asyncroll")
    commands = {"asyncroll --help": [str(exe), "--help"]} if exe.is_file() else {}
    commands["python -m asyncroll.cli --help"] = [sys.executable, "-m", "asyncroll.cli", "--help"]
    print(f"machine: {machine()}")
    print("| command | min s | median s | max s | repeats |\n|---|---:|---:|---:|---:|")
    if not exe.is_file():  # not measured here: the row says so (it vanished)
        print(f"| `asyncroll --help` (no {exe}) | n/a | n/a | n/a | 0 |")
    for name, argv in commands.items():
        times = []
        for _ in range(args.repeats):
            began = time.perf_counter()
            run_child(argv)
            times.append(time.perf_counter() - began)
        lo, mid, hi = quantiles(times)
        print(f"| `{name}` | {lo:.3f} | {mid:.3f} | {hi:.3f} | {args.repeats} |")


if __name__ == "__main__":
    run_main("bench.startup", main)
