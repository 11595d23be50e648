r"""Run the bounded LiveCodeBench experiment on one GPU: a thin entry point over the experiment runner.

    python scripts/run_lcb_bounded_single_gpu.py --config experiments/livecodebench_bounded_8x4.json \
        --model-path /models/Qwen2.5-Coder-7B-Instruct --workload data/lcb_stdin_219_seed20260927.jsonl \
        --output runs/lcb-8x4 [--workload-sha256 HEX] [--revision COMMIT] [--plan] [--resume]

Everything else (the vLLM command, the limits, the stages, the pairs) comes from the config; this script
only fills in where the model and the workload live on this machine, then does what ``asyncroll
experiment run`` (or ``plan``) does. See PROTOCOL_LIVECODEBENCH.md and docs/SINGLE_GPU.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from asyncroll.commands.common import say, stdout_lost
from asyncroll.errors import UsageError
from asyncroll.experiment.config import load_experiment_config
from asyncroll.experiment.preflight import checked_plan
from asyncroll.experiment.runner import ExperimentRunner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--model-path", required=True, help="Local model folder or hub id for the server.")
    parser.add_argument("--workload", type=Path, required=True, help="The converted workload JSONL.")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--workload-sha256", help="Expected SHA-256 of the workload (recommended).")
    parser.add_argument("--revision", help="Model revision to record and pass to the server.")
    parser.add_argument("--plan", action="store_true", help="Print every command; start nothing.")
    parser.add_argument("--resume", action="store_true", help="Continue an interrupted experiment.")
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {"model.path": args.model_path, "workload.path": str(args.workload.resolve())}
    if args.workload_sha256:
        overrides["workload.sha256"] = args.workload_sha256
    if args.revision:
        overrides["model.revision"] = args.revision
    try:
        flags = {"model.path": "--model-path", "workload.path": "--workload"}
        flags |= {"workload.sha256": "--workload-sha256", "model.revision": "--revision"}
        cfg = load_experiment_config(args.config, overrides, flags)
        if args.plan:
            say(checked_plan(cfg, args.output))  # refuses a wrong --workload-sha256 as the run does
            return 1 if stdout_lost() else 0
        # progress through say(), as `asyncroll experiment run`: a reader gone from stdout (| tee that
        # ended) silences it and the experiment runs on
        runner = ExperimentRunner(cfg, args.output, resume=args.resume, config_path=args.config, echo=say)
        outcome = runner.run()
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # a receipt that could not be written (a full disk)
        print(f"error: experiment failed: {exc}; --resume continues it once there is room", file=sys.stderr)
        return 1
    if outcome.exit_code:
        print(outcome.message, file=sys.stderr)
        return outcome.exit_code
    say(outcome.message)
    return 1 if stdout_lost() else 0  # the output asked for did not all arrive, as the CLI says


if __name__ == "__main__":
    sys.exit(main())
