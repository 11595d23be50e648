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

The policy is a pure function of the snapshot; predictions arrive in it, computed by the dispatcher.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncroll.policies.base import Decision, QueueSnapshot


@dataclass(frozen=True)
class PressurePolicy:
    name: str = "asyncroll"
    aging_seconds: float = 30.0
    aging_weight: float = 0.02
    tail_guard: bool = False

    def choose(self, snapshot: QueueSnapshot) -> Decision:
        jobs, now = snapshot.jobs, snapshot.now
        oldest = jobs[0]
        for job in jobs:  # oldest first: the first aged job is the oldest aged job
            if now - job.enqueued_at >= self.aging_seconds:
                return Decision(job.job_id, "hard_starvation_fifo")
        if len(jobs) < 2:
            return Decision(oldest.job_id, "not_eligible_single_job")
        if snapshot.model_outstanding >= snapshot.starvation_threshold:
            return Decision(oldest.job_id, "not_eligible_model_supply_ok")
        predictions = snapshot.predictions
        if len(predictions) != len(jobs):
            return Decision(oldest.job_id, "not_eligible_no_predictions")
        if self.tail_guard and not snapshot.admission_pending:
            best = min(range(len(jobs)), key=lambda i: (jobs[i].kind == "grade", -predictions[i].seconds, i))
            return Decision(jobs[best].job_id, "tail_guard_longest_predicted", eligible=True)
        weight = self.aging_weight
        best = min(
            range(len(jobs)),
            key=lambda i: (
                jobs[i].kind == "grade",
                predictions[i].seconds - weight * (now - jobs[i].enqueued_at),
                i,
            ),
        )
        return Decision(jobs[best].job_id, "low_model_supply_predicted_unlock", eligible=True)
