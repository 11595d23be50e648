"""The experiment runner: stages with gates, then the paired comparison; receipts, resume, fingerprint.

Order: qualification → opportunity screen → activation gate → comparison. A stage runs its arms once
and passes when every gate holds on their summaries (a metric that is unknown, or an arm that failed,
fails the gate: a stop rule never passes on missing evidence). A failed gate stops the experiment with
the reason recorded; the comparison then runs no arm. Comparison arms run in the planned, alternating
order; a failed arm is kept and reported, never retried.

The protocol fingerprint is computed afresh before every arm and again when its client exits: every arm
starts a fresh server and client that read the config's files, the tools and the code as they are then,
so a change mid-experiment stops it there, with the reason (what changed) recorded.

One runner per output directory: ``experiment.lock`` (``lock.py``) is held for the runner's lifetime, so
a second ``run`` or ``--resume`` on a directory a live runner uses is refused. Resume (``--resume`` on an
existing output) re-reads ``experiment.json``, refuses unless the protocol fingerprint and the plan are
unchanged, kills what a killed runner left behind (each recorded process group and tree, and what they
detached), moves the unfinished arms' directories aside (``<id>.interrupted-N``, kept and listed) and
runs only the arms that have not finished (``resume.py``). Finished arms (complete or failed) are never
run again; an arm whose ``arm.json`` says it finished, though the runner died (or was interrupted)
before ``experiment.json`` recorded it, is recorded then, not re-run; so is one that had its verdict
when the runner died stopping its processes (``resume.ended_with_verdict``).

SIGINT/SIGTERM/SIGHUP interrupt the arm (its processes are stopped, it is marked interrupted); further signals
while that cleanup runs are counted and ignored, so a second Ctrl-C never leaves a server running. An
unexpected error ends the experiment ``failed`` with the error recorded in ``experiment.json``.

The experiment's ``deadline_s`` bounds each ``run`` or ``--resume`` (wall seconds from its start; a
resume gets the whole of it again, or a deadline-stopped experiment could never be resumed, since the
config cannot change). When it passes before an arm, or cuts one while its server starts or its client
runs, the experiment ends ``stopped`` with a ``stop_reason`` that names the deadline (exit status 1) and
the stage ``deadline``; the cut arm is ``interrupted`` (``interrupted_by: "deadline"``), never failed, so
the comparison does not count it as a failed arm and ``--resume`` runs it again. Finished arms keep what
they recorded. A declared GPU that another job keeps busy past ``gpu.idle_wait_s`` stops the experiment
the same way, before the arm's server starts: the arm is ``interrupted`` (``interrupted_by: "gpu_busy"``),
the stage ``gpu_busy``, and ``--resume`` runs it once the GPU is idle. So does a server port that another
process (a neighbour's server) holds when the arm is about to start its server (``interrupted_by:
"port_busy"``, the stage ``port_busy``; ``--resume`` runs it once the port is free).

Before anything is created or changed, the setup is checked once (``preflight.py``): a server program
that cannot be found or a fixed port another process holds is refused with exit status 2, naming the
config field, instead of failing every arm in turn. On ``--resume`` the port is checked after the dead
runner's leftovers were killed (they may hold it); a refusal then is recorded in ``experiment.json``
(``stopped``, with the reason) and nothing runs.
"""

from __future__ import annotations

import errno
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncroll.errors import UsageError
from asyncroll.evaluator import cgroups_v2
from asyncroll.experiment import preflight
from asyncroll.experiment.arms import PROTOCOL_STEP, RESUME_WHEN, ExperimentInterrupted, run_arm
from asyncroll.experiment.client_check import Expected, load_summary
from asyncroll.experiment.comparison import build_comparison, reported_version, write_comparison
from asyncroll.experiment.config import STAGES, ExperimentConfig
from asyncroll.experiment.fingerprint import fingerprint, require_same
from asyncroll.experiment.gates import evaluate_gates, gate_text
from asyncroll.experiment.lock import LOCK_NAME, OutputLock
from asyncroll.experiment.machines import arm_machine
from asyncroll.experiment.plan import COMPARISON, ArmPlan, build_plan
from asyncroll.experiment.preflight import check_workload
from asyncroll.experiment.receipts import TERMINAL, ExperimentReceipt, now_iso, one_line
from asyncroll.experiment.resume import arm_dir, finished_arm, record_arm, recover, still_running
from asyncroll.experiment.signals import SignalGuard
from asyncroll.outputs.receipt import EXIT_FAILED as EXIT_INCOMPLETE
from asyncroll.outputs.receipt import EXIT_INTERRUPTED, EXIT_OK
from asyncroll.proctree import is_subreaper, set_subreaper
from asyncroll.runtime.prepare import refuse_unusable_umask, refuse_unwritable
from asyncroll.workload import EVALUATOR_TOOL


@dataclass(frozen=True, slots=True)
class Outcome:
    status: str
    exit_code: int
    message: str


class ExperimentRunner:
    """Runs (or resumes) one experiment into ``output``."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        output: Path,
        *,
        resume: bool = False,
        config_path: Path | None = None,
        echo: Callable[[str], None] = print,
        warn: Callable[[str], None] = lambda text: print(text, file=sys.stderr),
    ) -> None:
        """``echo``: the progress lines (stdout); ``warn``: a warning (stderr, which still says it when
        stdout's reader has gone)."""
        self.cfg = cfg
        self.output = output
        self.resume = resume
        self.config_path = config_path
        self.echo = echo
        self.warn = warn
        self.plan = build_plan(cfg)
        self._lock: OutputLock | None = None
        self._deadline_at: float | None = None
        self._guard: SignalGuard | None = None

    def run(self) -> Outcome:
        """Validate, lock, create or resume, run every unfinished arm, write comparison.json."""
        if self.cfg.deadline_s is not None:  # each run or resume gets the whole deadline
            self._deadline_at = time.monotonic() + self.cfg.deadline_s
        OutputLock.refuse_if_held(self.output)  # a live runner's directory: say so before its port
        sha, tools = check_workload(self.cfg)
        # on --resume the port waits until the dead runner's leftovers (which may hold it) are killed
        self._preflight(port=not self.resume)
        if self.cfg.workload.sha256 is None:
            self.warn(f"warning: workload.sha256 not declared; this experiment pins the workload at {sha}")
        for warning in preflight.deprecated_policies(self.cfg):  # each client says it only in its log
            self.warn(warning)
        fp = fingerprint(self.cfg, sha, tools)
        if EVALUATOR_TOOL in tools:  # before any arm: on cgroup v2 the clients start in the runner's leaf
            cgroups_v2.prepare_for_children()
            weak = preflight.isolation_problem(self.cfg)
            if weak is not None:
                raise self._refusal([weak])
        # a child subreaper (Linux): what a server or a client detaches (setsid -f, a double fork) is
        # re-parented to the runner, not init, so the stop of the process it came from finds and kills it
        subreaper = is_subreaper()
        set_subreaper(True)
        try:
            with SignalGuard() as guard:
                # A signal while a resume kills the dead runner's leftovers (a server holding the GPU)
                # and records them waits until that is done, then interrupts.
                with guard.deferred():
                    receipt = self._open(fp)
                    if self.resume:
                        self._preflight_resume(receipt)
                self._guard = guard
                try:
                    guard.raise_deferred()
                    return self._run_all(receipt)
                except ExperimentInterrupted as exc:
                    reason = f"interrupted by {exc}"  # also the report's reason for the status
                    _mark_cut_stages(receipt)
                    receipt.set_status("interrupted", error=reason, stop_reason=reason)
                    self._write_comparison(receipt)
                    ignored = (
                        f" ({guard.ignored} more signal(s) ignored while stopping)" if guard.ignored else ""
                    )
                    return Outcome(
                        "interrupted",
                        EXIT_INTERRUPTED,
                        f"interrupted by {exc}{ignored}; resume with --resume",
                    )
                except Exception as exc:  # noqa: BLE001 - recorded in experiment.json and reported, not lost
                    guard.hold()
                    return self._crashed(receipt, exc)
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None
            if not subreaper:
                set_subreaper(False)

    def _preflight(self, *, port: bool) -> None:
        """Refuse (UsageError, exit 2) a setup that would fail every arm; see ``preflight.py``."""
        found = preflight.problems(self.cfg, port=port)
        if found:
            raise self._refusal(found)

    def _preflight_resume(self, receipt: ExperimentReceipt) -> None:
        """The port check of a resume, once the dead runner's leftovers are killed: a refusal now is
        recorded (``stopped``, with the reason) before it is raised, so the receipt never says running."""
        found = preflight.problems(self.cfg)
        if not found:
            return
        reason = "--resume refused by the pre-flight check: " + "; ".join(found)
        receipt.data["resumes"][-1]["refused"] = reason
        receipt.set_status("stopped", stop_reason=reason)
        self._write_comparison(receipt)
        raise self._refusal(found)

    def _refusal(self, found: list[str]) -> UsageError:
        where = "" if self.config_path is None else f"{self.config_path}: "
        return UsageError(
            "pre-flight check failed; no arm was started:\n" + "\n".join(where + p for p in found)
        )

    def _crashed(self, receipt: ExperimentReceipt, exc: Exception) -> Outcome:
        """An unexpected error outside any arm: the experiment ends ``failed``, the error recorded."""
        error = str(exc) if isinstance(exc, UsageError) else f"unexpected error: {type(exc).__name__}: {exc}"
        written = "experiment.json"  # a full disk: it keeps its last state; --resume reads each arm.json
        try:
            _mark_cut_stages(receipt)
            receipt.set_status("failed", error=error, error_traceback=traceback.format_exc())
            written = "comparison.json"  # built from the arms' summaries: the same error may stop it
            self._write_comparison(receipt)
        except Exception as again:  # noqa: BLE001 - the first error is the one to report
            error += f" ({written} not written" + ("" if str(again) == str(exc) else f": {again!r}") + ")"
        return Outcome(
            "failed", EXIT_INCOMPLETE, f"experiment failed: {error}; see {self.output / 'experiment.json'}"
        )

    def _open(self, fp: dict[str, Any]) -> ExperimentReceipt:
        path = self.output / "experiment.json"
        try:
            os.lstat(path)
        except FileNotFoundError:
            pass
        except OSError as exc:  # a name too long, or a parent that is a file
            if exc.errno == errno.ENOTDIR and self.output.is_file():
                raise UsageError(f"--output {self.output} is a file, not a directory") from None
            raise UsageError(f"--output {self.output}: cannot be used: {exc.strerror or exc}") from None
        if not path.exists():
            if self.resume:
                raise UsageError(f"--resume: {path} does not exist; nothing to resume")
            try:
                if self.output.exists() and any(p.name != LOCK_NAME for p in self.output.iterdir()):
                    # a runner started at the same instant may have locked it since the first look
                    OutputLock.refuse_if_held(self.output)
                    raise UsageError(
                        f"--output {self.output} exists and is not empty; asyncroll never overwrites "
                        "(choose a new or empty directory)"
                    )
                if self.output.exists() and (owner := self.output.stat().st_uid) != os.geteuid():
                    # its owner may plant links in it, or read what the arms write there
                    raise UsageError(
                        f"--output {self.output}: an empty folder of another user's (uid {owner}); an "
                        "experiment writes into a new folder or an empty one of its own (choose another)"
                    )
                if self.output.is_symlink() and not self.output.exists():  # mkdir said "File exists"
                    raise UsageError(
                        f"--output {self.output} is a symbolic link to {os.readlink(self.output)}, which "
                        "does not exist: make that folder, or give another --output"
                    )
                made = not self.output.exists()
                self.output.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UsageError(f"--output {self.output}: {exc.strerror or exc}") from None
            if made:  # a umask of 0277 or 0444: refused, as run refuses it, before any server starts
                refuse_unwritable(self.output)
        refuse_unusable_umask(self.output)  # an empty --output of its own, or a resume: the arms' folders
        self._lock = OutputLock.acquire(self.output)
        plan = [a.to_dict() for a in self.plan]
        if path.exists():  # read again under the lock: another runner may have created it meanwhile
            if not self.resume:
                raise UsageError(
                    f"--output {self.output} already holds an experiment; pass --resume to continue it "
                    "(finished arms are kept) or choose a new directory"
                )
            receipt = ExperimentReceipt.load(path)
            try:
                require_same(receipt.data["fingerprint"], fp, f"resume of {self.output}")
                if receipt.data["plan"] != plan:
                    raise UsageError(
                        f"resume of {self.output}: the plan changed (arms, pairs, order or seeds)"
                    )
            except UsageError as exc:  # refused before recover: what the dead runner left still runs
                raise UsageError(f"{exc}{still_running(self.output, receipt)}") from None
            recover(receipt, self.output, self.plan, self.echo)
            return receipt
        (self.output / "arms").mkdir(parents=True, exist_ok=True)
        stages = {s: {"status": "pending", "arms": [], "gates": []} for s in (*STAGES, COMPARISON)}
        for stage in STAGES:
            if getattr(self.cfg.stages, stage) is None:
                stages[stage]["status"] = "not_configured"
        return ExperimentReceipt.create(
            path,
            {
                "name": self.cfg.name,
                "config_path": None if self.config_path is None else str(self.config_path.resolve()),
                "config": self.cfg.model_dump(mode="json"),
                "fingerprint": fp,
                "plan": plan,
                "stages": stages,
                "arms": {a.id: {"status": "pending", "attempts_interrupted": []} for a in self.plan},
            },
        )

    def _deadline_left(self) -> float:
        """Seconds until the deadline of this run or resume (inf without one)."""
        if self._deadline_at is None:
            return float("inf")
        return self._deadline_at - time.monotonic()

    def _deadline_reason(self, what: str) -> str:
        return (
            f"the experiment's deadline (deadline_s {self.cfg.deadline_s:g}s for this run) {what}; "
            "--resume runs the unfinished arms"
        )

    def _protocol_change(self, receipt: ExperimentReceipt, when: str) -> str | None:
        """Why the protocol is no longer the one the experiment started with (None: it is the same)."""
        try:
            sha, tools = check_workload(self.cfg)
            require_same(receipt.data["fingerprint"], fingerprint(self.cfg, sha, tools), when)
        except UsageError as exc:
            return str(exc)
        return None

    def _run_all(self, receipt: ExperimentReceipt) -> Outcome:
        for stage in (*STAGES, COMPARISON):
            state = receipt.data["stages"][stage]
            if state["status"] in ("passed", "not_configured", "complete"):
                continue
            if state["status"] == "failed":
                reason = (
                    f"stage {stage} failed its gate (stopped earlier at {stage}: a resume runs nothing more)"
                )
                return self._finish(receipt, "stopped", reason)
            arms = [a for a in self.plan if a.stage == stage]
            receipt.set_stage(stage, status="running", arms=[a.id for a in arms])
            for arm in arms:
                if receipt.arm(arm.id)["status"] in TERMINAL:
                    continue
                if self._deadline_left() <= 0:
                    receipt.set_stage(stage, status="deadline")
                    return self._finish(receipt, "stopped", self._deadline_reason(f"passed before {arm.id}"))
                changed = self._protocol_change(receipt, f"before {arm.id}")
                if changed is not None:
                    return self._finish(receipt, "stopped", changed)
                self._run_one(receipt, arm)
                record = receipt.arm(arm.id)
                if record.get("failed_step") == PROTOCOL_STEP:
                    return self._finish(receipt, "stopped", record["error"])
                if record["status"] == "interrupted" and record.get("interrupted_by") == "deadline":
                    receipt.set_stage(stage, status="deadline")
                    step = str(record.get("cut_step", "running")).replace("_", " ")
                    return self._finish(
                        receipt, "stopped", self._deadline_reason(f"cut {arm.id} while {step} (interrupted)")
                    )
                by = record.get("interrupted_by")
                if record["status"] == "interrupted" and by in RESUME_WHEN:  # gpu_busy, port_busy
                    receipt.set_stage(stage, status=by)
                    return self._finish(
                        receipt,
                        "stopped",
                        f"{one_line(record.get('error'))}; {arm.id} was not run (interrupted, not failed): "
                        f"--resume runs it once {RESUME_WHEN[by]}",
                    )
            if stage == COMPARISON:
                receipt.set_stage(stage, status="complete")
                continue
            spec = getattr(self.cfg.stages, stage)
            values = {
                a.arm: load_summary(arm_dir(self.output, a))
                for a in arms
                if receipt.arm(a.id)["status"] == "complete"
            }
            verdicts = evaluate_gates(spec.gates, spec.arms, values)
            failed_arms = [a.id for a in arms if receipt.arm(a.id)["status"] != "complete"]
            ok = all(v["passed"] for v in verdicts) and not failed_arms
            receipt.set_stage(
                stage, status="passed" if ok else "failed", gates=verdicts, failed_arms=failed_arms
            )
            self.echo(f"stage {stage}: {'passed' if ok else 'FAILED'}" + gate_text(verdicts, failed_arms))
            if not ok:
                return self._finish(receipt, "stopped", f"stage {stage} failed its gate")
        return self._finish(receipt, "complete", None)

    def _run_one(self, receipt: ExperimentReceipt, arm: ArmPlan) -> None:
        directory = arm_dir(self.output, arm)
        receipt.set_arm(arm.id, status="running", dir=str(directory), started_at=now_iso())
        self.echo(f"[{arm.id}] policy {arm.policy}, seed {arm.seed}: starting")
        try:
            result = run_arm(
                self.cfg,
                arm,
                directory,
                Expected.from_fingerprint(receipt.data["fingerprint"]),
                self.cfg.client.deadline_s,
                protocol_check=lambda: self._protocol_change(receipt, f"after {arm.id} ran"),
                time_left=None if self._deadline_at is None else self._deadline_left,
            )
            if result.status == "interrupted":  # the deadline cut it, or a busy GPU: not a failed arm
                error = result.data.get("error")
                receipt.set_arm(
                    arm.id,
                    status="interrupted",
                    error=error,
                    interrupted_by=result.data.get("interrupted_by"),
                    cut_step=result.data.get("cut_step"),
                )
                self.echo(f"[{arm.id}] interrupted: {one_line(error)}")
            else:
                record_arm(receipt, self.output, self.echo, arm, {**result.data, "status": result.status})
        except ExperimentInterrupted:
            # an arm that had finished (arm.json says so) before the interrupt stays finished
            finished = finished_arm(self.output, arm)
            if finished is not None:
                record_arm(receipt, self.output, self.echo, arm, finished)
            else:
                receipt.set_arm(arm.id, status="interrupted")
            raise
        except Exception as exc:
            finished = finished_arm(self.output, arm)
            if finished is not None:  # e.g. recording it failed: its arm.json verdict stands
                receipt.set_arm(arm.id, record_error=f"{type(exc).__name__}: {exc}")
                record_arm(receipt, self.output, self.echo, arm, finished)
            else:
                receipt.set_arm(
                    arm.id, status="failed", error=f"{type(exc).__name__}: {exc}", finished_at=now_iso()
                )
            raise

    def _finish(self, receipt: ExperimentReceipt, status: str, reason: str | None) -> Outcome:
        if self._guard is not None:  # every arm has ended: a signal now must not turn this into interrupted
            self._guard.hold()
        receipt.set_status(status, stop_reason=reason)  # type: ignore[arg-type]
        self._write_comparison(receipt)
        failed = [k for k, v in receipt.data["arms"].items() if v["status"] == "failed"]
        message = f"experiment {status}" + (f": {reason}" if reason else "")
        if failed:
            message += f"; failed arms kept and reported: {', '.join(failed)}"
        code = EXIT_OK if status == "complete" and not failed else EXIT_INCOMPLETE
        return Outcome(status, code, message + f"\ncomparison: {self.output / 'comparison.json'}")

    def _write_comparison(self, receipt: ExperimentReceipt) -> None:
        summaries, reported, machines = {}, {}, {}
        for arm in self.plan:
            if arm.stage == COMPARISON and receipt.arm(arm.id)["status"] == "complete":
                summaries[arm.id] = load_summary(arm_dir(self.output, arm))
            # every arm's, as the versions parsed from every arm's server log: a failed arm's server of
            # another version is flagged too
            reported[arm.id] = reported_version(arm_dir(self.output, arm))
            machines[arm.id] = arm_machine(arm_dir(self.output, arm))
        comparison = build_comparison(receipt.data, summaries, reported, machines)
        write_comparison(self.output / "comparison.json", comparison)


def _mark_cut_stages(receipt: ExperimentReceipt) -> None:
    """The stage a stop or a crash cut is never left "running": it is ``interrupted`` (not failed, which
    means a failed gate) and ``--resume`` runs it again, as it would a running one."""
    for state in receipt.data["stages"].values():
        if state["status"] == "running":
            state["status"] = "interrupted"
