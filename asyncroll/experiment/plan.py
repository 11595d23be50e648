"""The experiment's plan: every arm in run order, and the exact server and client command of each.

Pure functions of the config (no process, no network, no GPU), so ``asyncroll experiment plan`` prints
exactly what ``run`` will start, and resume can check that the plan did not change.

Pair order: ``fixed`` runs the arms as listed; ``alternating`` rotates them by the pair index (AB, BA,
AB, …) so no arm always runs first; ``balanced`` also reverses every other block of k pairs (AB, BA, BA,
AB for two arms), which balances both the first position and the carry-over between consecutive pairs.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from asyncroll.experiment.config import STAGES, ExperimentConfig

COMPARISON = "comparison"
#: The folder holding the asyncroll package the runner imported (site-packages, or a checkout's top).
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True, slots=True)
class ArmPlan:
    """One arm to run: which stage, which pair and position, which policy, which seed."""

    id: str
    stage: str
    pair: int | None
    position: int
    arm: str
    policy: str
    seed: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def pair_order(names: list[str], pair: int, order: str) -> list[str]:
    """Arm order of pair ``pair`` (0-based) under the ``fixed``, ``alternating`` or ``balanced`` rule."""
    k = len(names)
    if order == "fixed":
        return list(names)
    rotated = names[pair % k :] + names[: pair % k]
    if order == "balanced" and (pair // k) % 2 == 1:
        rotated.reverse()
    return rotated


def build_plan(cfg: ExperimentConfig) -> list[ArmPlan]:
    """Stages first (qualification → opportunity → activation), then the comparison pairs."""
    plan: list[ArmPlan] = []
    for stage in STAGES:
        spec = getattr(cfg.stages, stage)
        if spec is None:
            continue
        for j, name in enumerate(spec.arms):
            arm = cfg.arm(name)
            plan.append(ArmPlan(f"{stage}-{j + 1}-{name}", stage, None, j, name, arm.policy, cfg.seed))
    names = [a.name for a in cfg.arms]
    for pair in range(cfg.pairs):
        for position, name in enumerate(pair_order(names, pair, cfg.order)):
            arm = cfg.arm(name)
            plan.append(
                ArmPlan(
                    f"pair{pair + 1}-{name}", COMPARISON, pair, position, name, arm.policy, cfg.seed + pair
                )
            )
    return plan


def server_command(cfg: ExperimentConfig, port: int | str) -> list[str]:
    """The server command with every placeholder filled (``port`` may be a label in a printed plan)."""
    values = {
        "python": sys.executable,
        "host": cfg.server.host,
        "port": str(port),
        "model_path": cfg.model.path,
        "served_model_name": cfg.model.served_name,
        "revision": cfg.model.revision,
        **cfg.server.vars,
    }
    command = [token.format(**values) for token in cfg.server.command]
    if serves_this_asyncroll(cfg):  # as a client: this very asyncroll, not the working folder's
        from asyncroll.workers.spawn import child_flags

        command[1:1] = child_flags()
    return command


def serves_this_asyncroll(cfg: ExperimentConfig) -> bool:
    """Whether the server is asyncroll's own (``{python} -m asyncroll… serve-sim``): started, as a client
    is, with ``-P`` and :func:`client_environment`, or a folder holding another ``asyncroll`` (a checkout
    of another commit) served every arm with that folder's code. Not when ``server.vars`` names another
    ``{python}``: the runner knows nothing of that interpreter (``-P`` is an error before Python 3.11, and
    the runner's site-packages first on its path would hand it another version's compiled packages)."""
    given = cfg.server.command
    if "python" in cfg.server.vars:
        return False
    return given[:2] == ["{python}", "-m"] and len(given) > 2 and given[2].split(".")[0] == "asyncroll"


def server_launch(cfg: ExperimentConfig, port: int | str) -> list[str]:
    """The server command as a shell would run it: ``env NAME=VALUE …`` first when ``server.env`` adds
    to its environment (``CUDA_VISIBLE_DEVICES``, an attention backend), and for asyncroll's own server
    the :func:`client_environment` it gets, so a printed plan started by hand starts the same server as
    ``run``."""
    return _with_env(server_environment(cfg)) + server_command(cfg, port)


def server_environment(cfg: ExperimentConfig) -> dict[str, str]:
    """What the server's environment gets on top of the runner's: ``server.env``; for asyncroll's own
    server also the runner's asyncroll folder on ``PYTHONPATH`` (:func:`client_environment`), after the
    entries of a ``PYTHONPATH`` that ``server.env`` sets (it replaced the runner's folder, so the server
    ran whatever asyncroll those entries held, or found none)."""
    if not serves_this_asyncroll(cfg):
        return dict(cfg.server.env)
    from asyncroll.workers.spawn import pythonpath_with, users_pythonpath

    given = cfg.server.env.get("PYTHONPATH", users_pythonpath())
    return {**cfg.server.env, "PYTHONPATH": pythonpath_with(_PACKAGE_ROOT, given)}


def client_launch(cfg: ExperimentConfig, arm: ArmPlan, port: int | str, run_dir: Path) -> list[str]:
    """:func:`client_command` as a shell would run it, with the :func:`client_environment` ``run`` gives
    it (``-P`` keeps the working folder off its path: without it, a checkout not installed has none)."""
    return _with_env(client_environment()) + client_command(cfg, arm, port, run_dir)


def _with_env(env: dict[str, str]) -> list[str]:
    return ["env", *(f"{name}={value}" for name, value in env.items())] if env else []


def endpoint(cfg: ExperimentConfig, port: int | str) -> str:
    host = cfg.server.host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def client_environment() -> dict[str, str]:
    """What a client's environment (and the runner's own probes', ``python -P -m asyncroll…``) sets:
    ``PYTHONPATH`` with the folder holding the runner's asyncroll on it, so that the client imports this
    very asyncroll, whatever the installation, though ``-P`` keeps the working folder off its path.

    It goes after the user's own ``PYTHONPATH``, as in the runner, whose path holds them before its
    site-packages: a lab's numpy or scipy there (``module load``) is the one the runner imported and the
    fingerprint pinned, and the runner's site-packages first handed every client its own instead (each
    arm then failed on that software version). Where an entry there holds another asyncroll than the
    runner's (it ran ``python -m`` in a folder holding its own), the runner's folder goes first instead.
    A runner under ``python -E`` or ``-I`` ignored the user's entries: its clients get none of them."""
    from asyncroll.workers.spawn import pythonpath_with, users_pythonpath

    return {"PYTHONPATH": pythonpath_with(_PACKAGE_ROOT, users_pythonpath())}


def client_command(cfg: ExperimentConfig, arm: ArmPlan, port: int | str, run_dir: Path) -> list[str]:
    """``asyncroll run …`` for one arm: the shared client flags, the arm's policy and seed, its run dir.

    ``-P`` keeps the working directory off the client's ``sys.path``: an experiment run from a folder
    holding another ``asyncroll`` (a checkout of another commit) ran that code in every arm's client,
    while the fingerprint in experiment.json named the runner's."""
    c = cfg.client
    url = endpoint(cfg, port)
    from asyncroll.workers.spawn import child_flags

    cmd = [
        sys.executable,
        *child_flags(),
        "-m",
        "asyncroll",  # the command's own entry: a stop while it imports exits 130 with one line
        "run",
        "--workload",
        str(cfg.workload.path),
        "--output",
        str(run_dir),
        "--backend",
        c.backend,
        "--server-kind",
        cfg.server.kind,
        "--model",
        cfg.model.served_name,
        "--endpoint",
        url,
        "--policy",
        arm.policy,
        "--max-active-trajectories",
        str(c.max_active_trajectories),
        "--max-inflight-model-requests",
        str(c.max_inflight_model_requests),
        "--cpu-workers",
        str(c.cpu_workers),
        "--max-turns",
        str(c.max_turns),
        "--max-tokens",
        str(c.max_tokens),
        "--warmup-requests",
        str(c.warmup_requests),
        "--request-timeout",
        str(c.request_timeout),
        "--tool-timeout",
        str(c.tool_timeout),
        "--seed",
        str(arm.seed),
        "--no-progress",
    ]
    if cfg.workload.tool_root is not None:
        cmd += ["--tool-root", str(cfg.workload.tool_root)]
    if c.limit is not None:
        cmd += ["--limit", str(c.limit)]
    if c.replay:
        cmd.append("--replay")
    if c.dedicated_gpu:
        cmd.append("--dedicated-gpu")
    if cfg.gpu is not None:
        cmd += ["--nvml-device", str(cfg.gpu.index)]
    if cfg.server.metrics_path is not None:
        cmd += ["--metrics-url", url + cfg.server.metrics_path]
    if cfg.server.metrics_path is None and cfg.gpu is None:  # run refuses an interval with --no-telemetry
        cmd.append("--no-telemetry")
    else:
        cmd += ["--telemetry-interval", str(c.telemetry_interval)]
    return cmd + list(c.extra_args) + list(cfg.arm(arm.arm).extra_args)


def render_plan(cfg: ExperimentConfig, output: Path | None) -> str:
    """Human-readable plan: every arm with its exact server and client command (nothing is started)."""
    import shlex

    out = output or Path("OUTPUT")
    port: int | str = cfg.server.port if cfg.server.port else "PORT"
    arms = ", ".join(f"{a.name}={a.policy}" for a in cfg.arms)
    lines = [
        f"experiment {cfg.name}: {len(cfg.arms)} arms ({arms}), "
        f"baseline {cfg.baseline_arm}, {cfg.pairs} pairs, order {cfg.order}",
        f"workload {cfg.workload.path} (expected sha256 {cfg.workload.sha256 or 'not declared'})",
        "gpu: "
        + (
            "not declared (no identity or idle check)"
            if cfg.gpu is None
            else f"index {cfg.gpu.index}, idle check before each arm"
        ),
    ]
    if not cfg.server.port:
        lines.append("PORT: a free port chosen when each arm starts")
    for arm in build_plan(cfg):
        where = arm.stage if arm.pair is None else f"pair {arm.pair + 1} position {arm.position + 1}"
        lines.append(f"\n[{arm.id}] {where}: policy {arm.policy}, seed {arm.seed}")
        lines.append("  server: " + shlex.join(server_launch(cfg, port)))
        lines.append("  client: " + shlex.join(client_launch(cfg, arm, port, out / "arms" / arm.id / "run")))
    for stage in STAGES:
        spec = getattr(cfg.stages, stage)
        for gate in [] if spec is None else spec.gates:
            lines.append(f"gate {stage}: {gate.metric} {gate.op} {gate.value:g} on {gate.arm or 'every arm'}")
    return "\n".join(lines)
