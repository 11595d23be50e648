"""The pressure-aware policy (``--policy asyncroll``): when the model side is about to starve, run the
CPU job predicted to unlock model work soonest.

At each dispatch, in this order (SPEC §6):

1. **Hard aging**: a job that has waited ≥ ``aging_seconds`` is taken first, oldest first
   (``hard_starvation_fifo``; not an eligible reorder, whatever it changes).
2. **Eligibility**: ≥ 2 jobs queued and model outstanding < ``starvation_threshold`` (default: the
   inflight capacity — proactive: refill the pipeline before it empties; 1 is the reactive trigger).
   Otherwise FIFO, with the reason it was not eligible.
3. **Score** (eligible): the minimum of (is a grade job, predicted seconds − ``aging_weight`` × waited
   seconds, job order): tool/evaluation jobs first, then the shortest predicted, softly aged.

The **tail guard** (``asyncroll_guarded``) changes step 3 when no problem waits for admission — the
finite batch's tail, where shortest-first leaves the long jobs to run last with nothing to overlap them:
it prefers the *longest* predicted job (longest-processing-time first, the critical-path proxy a policy
can know without reading the future).

**Unlock** (``asyncroll_unlock``, the previous default) keeps the seed's trigger and score but fixes two
things the map showed:

- A grade job also unlocks model work when a problem waits for admission: it ends its trajectory,
  frees an active slot, and the next problem's first model request follows. So while admission is
  pending, grade jobs compete on predicted time like every other job (the seed ranks them last, which
  keeps finished trajectories holding slots — the reason ``tool_first`` and the seed's rule lose to
  FIFO where CPU dominates). In the tail, when no problem waits, a grade job unlocks nothing and ranks
  last.
- Hard aging is relative as well as absolute: a job is also taken oldest-first once it has waited
  ``drain_multiple`` × the predicted time to drain the whole queue on the pool (Σ predicted ÷ workers),
  so shortest-first cannot starve long jobs into a pile at the end of a finite batch — the loss the
  issue warned about where CPU dominates. ``aging_seconds`` stays the absolute cap.

**Critical path** (``asyncroll_critical``, what ``--policy asyncroll`` meant from 2026-12-01 until the chain
rule below refined it on 2026-12-03; chosen by the simulated map in RESULTS.md) is the unlock rule without
the relative aging, plus the tail rule the relative aging stood in for.
In the tail (no problem waits for admission), when the rule is eligible, step 3 starts the job whose
trajectory has the most work left after it — the mean remaining service of trajectories after jobs like it
(:mod:`asyncroll.policies.remaining`, learned from the run's own events; unknown counts as 0; grade jobs,
which end their trajectory, last) — as Schrage's largest-delivery-time rule does for one bottleneck machine.
The trajectories with the longest road ahead get moving first instead of waiting behind short jobs, so the
batch does not end on one long chain; the relative aging that guarded against that end also cost most of
shortest-first's gain where few trajectories share few workers (8 active / 4 inflight / 1–2 workers). Only the
absolute ``aging_seconds`` cap remains.

**Balanced** (``asyncroll_balanced``, kept for comparison; the default for a few hours on 2026-12-03) is
the critical-path rule with one guard in the tail, for pools of two or more workers: when the longest
predicted tool/evaluation job is longer than the pool's even share of all the other queued work plus what
the running jobs have left, it goes first (longest-processing-time first's point: started after the rest,
it would run alone at the end while the other workers idle). It removes the critical rule's one loss to
FIFO on the 200-trajectory map (16 active / 8 inflight / 2 workers, ~600 ms jobs) but loses to FIFO on
20-trajectory batches at 32 / 4 / 2, where every problem is admitted at once: the guard counts only the
queued and running jobs, not the CPU work of trajectories waiting for the model, so it fires too early
(RESULTS.md). With one worker the guard stays off.

**Chain** (``asyncroll_chain``, kept for comparison; the default for a few hours on 2026-12-03) is the
critical-path rule with the work
after each job learned step by step (:class:`~asyncroll.policies.remaining.StepwiseWork`, a Markov chain
over job keys) instead of from
finished trajectories, whose first finishers — those without a repair — make the work after a first
evaluation look small on a small batch. The rule's code is the critical rule's; only its estimates differ:
the same on the 200-trajectory map, better on 20-trajectory batches (RESULTS.md).

**Repair** (``asyncroll_repair``, what ``--policy asyncroll`` means) is the chain rule with one change to
its estimate: after a first evaluation, the repair that may follow counts at *this* job's predicted execute
time instead of the mean of every repair after jobs like it (a repair evaluates nearly the same thing, and
the predictor predicts it by its first evaluation's time once that is known). A long first evaluation then
goes before its repair would run alone at the batch's end: the chain rule's one loss to FIFO on the
200-trajectory map (16 active / 8 inflight / 2 workers, ~600 ms jobs) becomes a gain (RESULTS.md).

The policy is a pure function of the snapshot; predictions arrive in it, computed by the dispatcher.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from asyncroll.floats import left_to_right_sum
from asyncroll.policies.base import Decision, QueueSnapshot


@dataclass(frozen=True)
class PressurePolicy:
    name: str = "asyncroll"
    aging_seconds: float = 30.0
    aging_weight: float = 0.02
    tail_guard: bool = False
    unlock: bool = False
    drain_multiple: float | None = 2.0
    critical_path: bool = False
    straggler: bool = False

    @property
    def reads_remaining(self) -> bool:
        """Whether :meth:`choose` reads the tail's remaining-work estimates (the critical-path rules)."""
        return self.critical_path

    @staticmethod
    def _straggler(snapshot: QueueSnapshot) -> int | None:
        """The longest predicted tool/evaluation job if it would end the batch alone: longer than the
        pool's even share of every other queued job and of what the running jobs have left (started after
        them, it would finish that much after the others, with the other workers idle)."""
        jobs, seconds = snapshot.jobs, [p.seconds for p in snapshot.predictions]
        longest = max(range(len(jobs)), key=lambda i: (jobs[i].kind != "grade", seconds[i], -i))
        others = left_to_right_sum(seconds) - seconds[longest] + snapshot.running_left
        if jobs[longest].kind == "grade" or seconds[longest] <= others / snapshot.workers:
            return None
        return longest

    def choose(self, snapshot: QueueSnapshot) -> Decision:
        jobs, now = snapshot.jobs, snapshot.now
        oldest = jobs[0]
        limit = self.aging_seconds
        predictions = snapshot.predictions
        if self.unlock and self.drain_multiple is not None and len(predictions) == len(jobs):
            drain_s = left_to_right_sum(p.seconds for p in predictions) / max(1, snapshot.workers)
            limit = min(limit, self.drain_multiple * drain_s)
        for job in jobs:  # oldest first: the first aged job is the oldest aged job
            if now - job.enqueued_at >= limit:
                return Decision(job.job_id, "hard_starvation_fifo")
        if len(jobs) < 2:
            return Decision(oldest.job_id, "not_eligible_single_job")
        if snapshot.model_outstanding >= snapshot.starvation_threshold:
            return Decision(oldest.job_id, "not_eligible_model_supply_ok")
        if len(predictions) != len(jobs):
            return Decision(oldest.job_id, "not_eligible_no_predictions")
        remaining = snapshot.remaining
        if self.critical_path and len(remaining) == len(jobs):
            # the tail (the dispatcher fills ``remaining`` only there): the job whose trajectory has the
            # most work left after it goes first (Schrage's largest-delivery-time rule); unknown = 0. A
            # grade job ends its trajectory (nothing after it) and goes last, even against a tool job of
            # a kind not seen to finish yet.
            if self.straggler and snapshot.workers > 1:
                longest = self._straggler(snapshot)
                if longest is not None:
                    return Decision(jobs[longest].job_id, "tail_straggler_longest", eligible=True)
            best = max(range(len(jobs)), key=lambda i: (jobs[i].kind != "grade", remaining[i] or 0.0, -i))
            return Decision(jobs[best].job_id, "tail_critical_path", eligible=True)
        if self.tail_guard and not snapshot.admission_pending:
            best = min(range(len(jobs)), key=lambda i: (jobs[i].kind == "grade", -predictions[i].seconds, i))
            return Decision(jobs[best].job_id, "tail_guard_longest_predicted", eligible=True)
        weight = self.aging_weight
        # The minimum of (grade job while grades go last, score, job order) without a key tuple per queued
        # job: the scores in one comprehension, then ``min`` over the candidates' indices in order, keyed
        # by their scores (a C loop, that keeps the first of equal scores as the tuples' order did). While
        # grades go last, the candidates are the tool/evaluation jobs, or every job if all or none are.
        scores = [
            prediction.seconds - weight * (now - job.enqueued_at)
            for job, prediction in zip(jobs, predictions, strict=True)
        ]
        candidates: Sequence[int] = range(len(jobs))
        if not (self.unlock and snapshot.admission_pending):
            unlocking = [i for i, job in enumerate(jobs) if job.kind != "grade"]
            if 0 < len(unlocking) < len(jobs):
                candidates = unlocking
        best = min(candidates, key=scores.__getitem__)
        return Decision(jobs[best].job_id, "low_model_supply_predicted_unlock", eligible=True)
