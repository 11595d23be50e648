"""Pre-flight: the setup errors that would fail every arm in turn, found once, before any arm starts.

A server command whose program cannot be found, or a fixed port another process holds, fails each arm at
``starting_server``, one after the other, and leaves an output directory full of failed arms that say
nothing about the policies. ``run`` refuses such a config (exit 2) before it creates or changes anything;
``experiment plan``, which may be printed on a machine that is not the one that will run it, names the
same problems as notes and still prints the plan.

Only what can be checked honestly is checked: that the server command's program resolves (a path to an
executable file, or a name found on the ``PATH`` the server will get, ``server.env`` included, as
``subprocess`` resolves it), that each arm's client accepts its flags (``extra_args`` included), that a
fixed ``server.port`` can be bound on ``server.host`` now, and, for a
code workload, that the sandbox the clients will probe has every layer unless each arm allows weak
isolation (``run`` only: it is this machine's). A port chosen per arm (``server.port: 0``) is not checked;
neither is a port that becomes busy later (each arm checks its own before it starts its server).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from asyncroll.errors import UsageError, no_directory, no_file
from asyncroll.experiment.config import ExperimentConfig
from asyncroll.experiment.plan import client_environment, render_plan, server_command
from asyncroll.experiment.port_busy import BOUND_ONLY, reserved
from asyncroll.paths import resolved
from asyncroll.workers.spawn import child_flags


def executable_problem(cfg: ExperimentConfig) -> str | None:
    """Why the server command's program cannot be started (None: it can), naming the config field."""
    program = server_command(cfg, cfg.server.port or 0)[0]
    template = cfg.server.command[0]
    shown = repr(program) if program == template else f"{program!r} ({template!r})"
    where = "server.command[0]"
    if os.path.dirname(program):  # a path: subprocess runs it as it is, relative to the current folder
        path = Path(program)
        try:
            mode = path.stat().st_mode  # not Path.exists(): it passes over a symlink loop (ELOOP) as absent
        except OSError as exc:  # a folder on its way this user may not search, a name too long, a loop
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return f"{where}: {shown} does not exist"
            return f"{where}: {shown} cannot be looked up: {exc.strerror or exc}"
        except ValueError:  # a NUL character (refused with the config's settings before this)
            return f"{where}: {shown} does not exist"
        if stat.S_ISDIR(mode):
            return f"{where}: {shown} is a directory, not a program"
        if not os.access(path, os.X_OK):
            return f"{where}: {shown} is not executable (chmod +x it, or put its interpreter first)"
        return None
    search = {**os.environ, **cfg.server.env}.get("PATH", os.defpath)
    if shutil.which(program, path=search) is None:
        return (
            f"{where}: {shown} is not found on PATH (the server's PATH, server.env included); install it, "
            "or give the program's path"
        )
    return None


def port_problem(cfg: ExperimentConfig) -> str | None:
    """Why the fixed ``server.port`` cannot be bound on ``server.host`` now (None: it can). With port 0
    (a free port chosen when each arm starts) the host is checked the same way: one that no local
    interface has would fail every arm."""
    host, port = cfg.server.host, cfg.server.port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            # as servers bind: a connection of an earlier arm's server in TIME_WAIT does not count
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return (
                f"server.port: {host}:{port} is in use by another process (a server still running?); "
                "stop it, or set server.port to 0 to pick a free port for each arm"
            )
        return f"server.host/server.port: cannot bind {host}:{port}: {exc.strerror or exc}"
    if port and reserved(family, host, port):  # bound beside one that set SO_REUSEADDR (a vLLM loading)
        return (
            f"server.port: {host}:{port} is held by {BOUND_ONLY}; stop it, or set server.port to 0 to pick a "
            "free port for each arm"
        )
    return None


def problems(cfg: ExperimentConfig, *, port: bool = True) -> list[str]:
    """Every pre-flight problem of ``cfg`` on this machine, now (``port=False``: the program and the
    clients' flags only)."""
    found = [executable_problem(cfg), port_problem(cfg) if port else None]
    return [p for p in found if p is not None] + client_flag_problems(cfg)


def client_flag_problems(cfg: ExperimentConfig) -> list[str]:
    """What each arm's client (``asyncroll run`` with ``client.extra_args`` and the arm's ``extra_args``)
    would refuse in its flags (exit 2): an unknown flag, a value of the wrong type or out of range
    (``--aging-weight -1``, ``--starvation-threshold 0``). Read by the client's own parser and settings,
    so such an arm was found only once its server had started, after the stages before it had run."""
    import typer

    from asyncroll.cli import app
    from asyncroll.commands.click_errors import ClickException
    from asyncroll.config import build_config
    from asyncroll.errors import UsageError as SettingsError
    from asyncroll.experiment.plan import ArmPlan, client_command

    run = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    refused: dict[str, list[str]] = {}
    for spec in cfg.arms:
        arm = ArmPlan(
            id=spec.name, stage="", pair=None, position=0, arm=spec.name, policy=spec.policy, seed=0
        )
        command = client_command(cfg, arm, 1, Path("OUTPUT", "run"))
        args = command[command.index("run") + 1 :]  # after `python -P -m asyncroll run`
        if "--help" in args:  # the client would print its help and exit 0, running nothing
            refused.setdefault("--help among them: the client would run nothing", []).append(spec.name)
            continue
        try:
            with run.make_context("run", args) as ctx:
                flags = {k: v for k, v in ctx.params.items() if k != "config" and v is not None}
            if flags.get("endpoint"):  # click's list: the plan gives it once (a second one is refused,
                flags["endpoint"] = flags["endpoint"][0]  # as --gpu-slots is, by the config's managed flags)
            build_config(flags)
        except ClickException as exc:
            problem = exc.format_message()
        except SettingsError as exc:
            problem = str(exc)
        else:
            continue
        refused.setdefault(problem, []).append(spec.name)
    # a problem of client.extra_args is every arm's: said once, naming them
    return [
        f"{', '.join(f'arms[{name}]' for name in names)}: the client's flags (client.extra_args and the "
        f"arm's extra_args), as asyncroll run reads them: {problem}"
        for problem, names in refused.items()
    ]


WEAK_FLAGS = ("--allow-weak-isolation", "--no-allow-weak-isolation")


def isolation_problem(cfg: ExperimentConfig) -> str | None:
    """Why the clients of a code workload (``lcb_evaluate``) would refuse to start (None: they would
    not): this machine's sandbox lacks a layer, and an arm does not pass ``--allow-weak-isolation``. Each
    arm's client refused only once its server was up (a model loaded for minutes), and the first stage
    then failed its gate as if that were a result. Probed as the clients probe it, in a process the runner
    starts (call after :func:`~asyncroll.evaluator.cgroups_v2.prepare_for_children`). No temporary folder
    for the evaluations' scratch files (a read-only /tmp, TMPDIR missing) refuses every arm, weak or not."""
    from asyncroll.evaluator.isolation import scratch_problem

    no_scratch = scratch_problem()  # the clients inherit this environment: they would find none either
    if no_scratch is not None:
        return f"workload: it runs untrusted code (lcb_evaluate), and {no_scratch}"
    strict = [
        arm.name
        for arm in cfg.arms
        if [a for a in (*cfg.client.extra_args, *arm.extra_args) if a in WEAK_FLAGS][-1:] != [WEAK_FLAGS[0]]
    ]
    if not strict:
        return None
    report = isolation_report()
    if not report.get("weak"):
        return None
    return (
        f"workload: it runs untrusted code (lcb_evaluate), and this machine's sandbox lacks "
        f"{', '.join(report.get('missing') or ['its layers'])} (`python -m asyncroll.evaluator.isolation` "
        f"says why): the clients of {', '.join(strict)} would refuse to start, each once its server was up. "
        "Run as root with util-linux and writable memory/pids cgroups (docs/CODE_PROBLEMS.md: the sandbox), "
        'or add "--allow-weak-isolation" to client.extra_args to run the programs with the layers that work'
    )


def isolation_report() -> dict[str, Any]:
    """``python -m asyncroll.evaluator.isolation``'s report (the probe forks: not in the runner itself)."""
    try:
        done = subprocess.run(
            [sys.executable, *child_flags(), "-m", "asyncroll.evaluator.isolation"],  # as client_command
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **client_environment()},
        )
        report = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}  # no verdict: each client probes for itself, as before
    return report if isinstance(report, dict) else {}


def check_workload(cfg: ExperimentConfig) -> tuple[str, dict[str, Path | None]]:
    """Validate the workload as the client will read it; its SHA-256 must match the declared one."""
    from asyncroll.workload import scan_workload

    given = cfg.workload.tool_root
    if given is not None and not given.is_dir():
        raise UsageError(f"{cfg.named('workload.tool_root')} {given}: {no_directory(given)}")
    root = given or cfg.workload.path.parent
    root = resolved(root)  # a symlink loop: the workload in it is refused as unreadable by the scan
    path = cfg.named("workload.path")  # the config file and its setting, or the option that gave it
    scan = scan_workload(
        cfg.workload.path, root, scripted=cfg.client.replay, limit=cfg.client.limit, flag=path
    )
    scan.raise_if_invalid()
    if cfg.workload.sha256 is not None and scan.sha256 != cfg.workload.sha256:
        declared = cfg.named("workload.sha256", lead=False)
        raise UsageError(
            f"{path} {cfg.workload.path}: sha256 {scan.sha256} is not the declared {declared} "
            f"{cfg.workload.sha256}; wrong file or a changed workload"
        )
    return scan.sha256, {key: tool.path for key, tool in scan.tools.items()}


def deprecated_policies(cfg: ExperimentConfig) -> list[str]:
    """A warning for each arm under a deprecated policy alias (``gpu_first``), as run and simulate warn."""
    from asyncroll.config import DEPRECATED_ALIASES

    said = "warning: arms[{}].policy: {} is a deprecated alias of {}"
    return [
        said.format(arm.name, arm.policy, DEPRECATED_ALIASES[arm.policy])
        for arm in cfg.arms
        if arm.policy in DEPRECATED_ALIASES
    ]


def checked_plan(cfg: ExperimentConfig, output: Path | None) -> str:
    """The plan as the dry run of :meth:`ExperimentRunner.run` (``experiment plan``, the LiveCodeBench
    script's ``--plan``): where the config declares ``workload.sha256``, the workload is first checked
    exactly as the run checks it (:func:`check_workload`), so a wrong file or hash is refused here, with
    the run's message, and not only when the run starts. Without a declared hash the workload is not
    read (a plan can be printed on a machine that does not hold it).

    The pre-flight problems ``run`` would refuse (a server program not found, a fixed port in use, a
    workload file not found here) are named after the plan, as notes about this machine now: the plan is
    often printed elsewhere."""
    if cfg.workload.sha256 is not None:
        check_workload(cfg)
    text = render_plan(cfg, output)
    found = problems(cfg)
    if cfg.workload.sha256 is None and not cfg.workload.path.is_file():  # run's first refusal
        found.insert(
            0, f"{cfg.named('workload.path')} {cfg.workload.path}: {no_file(cfg.workload.path, 'a workload')}"
        )
    if found:
        text += "\n\npre-flight on this machine, now (`run` refuses until fixed):\n" + "\n".join(
            f"  {problem}" for problem in found
        )
    return text
