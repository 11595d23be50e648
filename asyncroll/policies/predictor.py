"""Online prediction of CPU-job execute time: ridge regression on log seconds, plus a repair prior.

Features are computed before execution from the job alone (never from its outputs): a bias, log bytes of
tool arguments, whether the job is a resubmission (the trajectory already ran this tool), whether it is
a grade job, log of the number of test cases, log bytes of test inputs, log bytes of submitted code, and the
tool's identity in one of a few one-hot buckets so that multi-tool workloads are told apart: the bucket
its name hashes to (CRC-32, the same in every process), or the next free one when another tool of the run
already has that (so up to ``HASH_BUCKETS`` tools never share one, whatever their names).

The target is ``log(seconds) − log(prior)``, fitted by scikit-learn's ridge solver (``ridge_regression``,
the solver behind ``Ridge``) without a separate intercept, so the penalty pulls every coefficient — the
bias included — toward the prior (~100 ms): a weak prior that a handful of observations overrides. A
resubmission uses the same trajectory's first run of that tool when it is known
(``same_problem_first_evaluation``), kept until the trajectory ends
(:meth:`DurationPredictor.end_trajectory`). Timed-out jobs are observed *censored* at the timeout, never
dropped. The model refits lazily, once, at the first prediction after new observations (after each of
the first 63, then after every ~3% more, but at least once per half window, so that no observation
leaves the window unfitted), on a bounded window (a ring buffer of the newest observations); predicting
the whole queue is one matrix product. Predictions are clamped to [1 ms, 60 s]. One instance per run:
state never leaks between runs.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from asyncroll.policies.base import JobView, Prediction

HASH_BUCKETS = 8
FEATURES = 7 + HASH_BUCKETS
MIN_S, MAX_S = 0.001, 60.0
#: the largest exponent a prediction is taken the exponential of: anything above it is clamped to ``MAX_S``
#: anyway, and a fit extrapolated far past its data (a 1 MB argument to a tool seen with 9 and 10 bytes)
#: can reach log seconds past ~709, whose exponential is no float (OverflowError, numpy's RuntimeWarning)
EXP_CAP = math.log(MAX_S) + 1.0
SMALL_BATCH = 8


def tool_bucket(tool: str) -> int:
    """The one-hot bucket a tool's name hashes to: CRC-32, the same in every process (``hash`` of a str
    is not)."""
    return zlib.crc32(tool.encode()) % HASH_BUCKETS


def features(job: JobView, bucket: int | None = None) -> list[float]:
    """The job's row; ``bucket``: its tool's one-hot bucket (default: the one its name hashes to)."""
    row = [
        1.0,
        math.log1p(job.arg_bytes),
        float(job.resubmission),
        float(job.kind == "grade"),
        # log, like the sizes: in a model of log seconds a raw count is an exponential in the count (4x the
        # tests of the jobs seen predicted 87x their time, where an evaluation's time grows about linearly)
        math.log1p(job.n_tests),
        math.log1p(job.test_bytes),
        math.log1p(job.code_bytes),
    ]
    onehot = [0.0] * HASH_BUCKETS
    onehot[tool_bucket(job.tool) if bucket is None else bucket] = 1.0
    return row + onehot


class DurationPredictor:
    def __init__(self, prior_s: float = 0.1, alpha: float = 1.0, window: int = 1024) -> None:
        self.prior_s = prior_s
        self._log_prior = math.log(prior_s)
        self._alpha = alpha
        # The training window is a ring buffer of preallocated arrays: converting a list of a thousand
        # rows to an array cost more than the fit itself.
        self._x = np.zeros((window, FEATURES), dtype=np.float64)
        self._y = np.zeros(window, dtype=np.float64)
        self._stored = 0  # rows of the window in use
        self._next = 0  # where the next observation goes
        # observations not yet in the window: written there in one step before the next refit (a row
        # copied from a list into a numpy row one at a time cost more than the rest of ``observe``)
        self._new_x: list[list[float]] = []
        self._new_y: list[float] = []
        self._coef: np.ndarray[Any, np.dtype[np.float64]] | None = None
        self._coef_list: list[float] = []
        self._dirty = False
        self._pending = 0  # observations since the last refit
        # trajectory → tool → its first run's seconds, until the trajectory ends (``end_trajectory``): a
        # repair is predicted by its trajectory's first run, and no job of an ended trajectory comes again
        self._first: dict[str, dict[str, float]] = {}
        self._rows: dict[int, list[float]] = {}  # feature rows of queued jobs, computed once
        # ... and the same rows in a matrix (a free slot each), so that a large batch is one fancy index,
        # not a list of lists turned into an array at every refit
        self._queued = np.zeros((64, FEATURES), dtype=np.float64)
        self._slots: dict[int, int] = {}  # job id → its row in ``_queued``
        self._free: list[int] = list(range(63, -1, -1))  # free rows, lowest last (popped first)
        self._cache: dict[int, Prediction] = {}  # job id → prediction by the current model
        self._buckets: dict[str, int] = {}  # tool → its one-hot bucket in this run
        self._taken: set[int] = set()  # the buckets a tool has
        self.observations = 0
        self.censored = 0
        self.refits = 0

    def observe(self, job: JobView, seconds: float, *, censored: bool = False) -> None:
        """Learn from a finished job (``censored``: it hit the timeout; ``seconds`` is the timeout)."""
        self._cache.pop(job.job_id, None)
        row = self._rows.pop(job.job_id, None)
        self._release(job.job_id)
        if math.isnan(seconds):  # passes the clamp below as NaN, and one NaN in the window fits NaN for all
            return
        seconds = min(max(seconds, MIN_S / 10), MAX_S * 10)
        self._new_x.append(row if row is not None else self._features(job))
        self._new_y.append(math.log(seconds) - self._log_prior)
        if len(self._new_y) == len(self._y):  # a whole window waits: the older ones would be overwritten
            self._flush()
        self._dirty = True
        self._pending += 1
        self.observations += 1
        self.censored += censored
        if not job.resubmission:
            first = self._first.get(job.trajectory_id)
            if first is None:
                self._first[job.trajectory_id] = {job.tool: seconds}
            else:
                first.setdefault(job.tool, seconds)

    def end_trajectory(self, trajectory_id: str) -> None:
        """The trajectory ended: its first runs are forgotten (no repair of it will come), so that what the
        predictor keeps is bounded by the trajectories in flight, not by the run's length."""
        self._first.pop(trajectory_id, None)

    def _flush(self) -> None:
        """Write the observations since the last refit into the ring buffer, oldest first (the same rows
        at the same places as one at a time)."""
        rows, ys = self._new_x, self._new_y
        if not ys:
            return
        size, start = len(self._y), self._next
        end = start + len(ys)  # at most ``size`` rows wait (``observe``)
        if end <= size:
            self._x[start:end] = rows
            self._y[start:end] = ys
        else:
            first = size - start
            self._x[start:] = rows[:first]
            self._y[start:] = ys[:first]
            self._x[: end - size] = rows[first:]
            self._y[: end - size] = ys[first:]
        self._next = end % size
        self._stored = min(self._stored + len(ys), size)
        self._new_x, self._new_y = [], []

    def _refit(self) -> None:
        # scikit-learn's functional ridge solver on already-validated float64 arrays: the same solution
        # as ``Ridge(fit_intercept=False).fit`` (tested) without its input and parameter checking.
        self._flush()
        n = self._stored
        coef = _ridge()(self._x[:n], self._y[:n], self._alpha)
        self._coef = np.asarray(coef, dtype=np.float64)
        self._coef_list = [float(c) for c in self._coef]
        self._dirty = False
        self._pending = 0
        self.refits += 1
        self._cache.clear()  # every prediction was the old model's

    def _features(self, job: JobView) -> list[float]:
        """The job's row, with its tool's bucket in this run: the bucket its name hashes to, unless another
        tool already has that one — then the next free one, so that up to ``HASH_BUCKETS`` tools are told
        apart whatever their names (two hashed to one bucket were predicted alike: a 5 ms tool and a 2 s
        one both at ~100 ms); past that, the hashed bucket, shared. A grade job has a feature of its own
        and takes its hashed bucket without claiming it."""
        if job.kind == "grade":
            return features(job)
        bucket = self._buckets.get(job.tool)
        if bucket is None:
            bucket = tool_bucket(job.tool)
            taken = self._taken
            if len(taken) < HASH_BUCKETS:  # else every bucket has a tool: share the hashed one
                while bucket in taken:
                    bucket = (bucket + 1) % HASH_BUCKETS
                taken.add(bucket)
            self._buckets[job.tool] = bucket
        return features(job, bucket)

    def forget(self, job: JobView) -> None:
        """A queued job that will never be observed (its caller gave up)."""
        self._rows.pop(job.job_id, None)
        self._release(job.job_id)
        self._cache.pop(job.job_id, None)

    def _release(self, job_id: int) -> None:
        slot = self._slots.pop(job_id, None)
        if slot is not None:
            self._free.append(slot)

    def _slot(self, job_id: int, row: list[float]) -> int:
        """The job's row in the matrix of queued jobs' features, stored there on first use."""
        slot = self._slots.get(job_id)
        if slot is None:
            if not self._free:  # more jobs queued than rows: twice the rows
                size = len(self._queued)
                self._queued = np.concatenate([self._queued, np.zeros_like(self._queued)])
                self._free = list(range(2 * size - 1, size - 1, -1))
            slot = self._slots[job_id] = self._free.pop()
            self._queued[slot] = row
        return slot

    def predict(self, jobs: Sequence[JobView]) -> tuple[Prediction, ...]:
        if not jobs:
            return ()
        self._refit_if_due()
        self._fill(jobs)
        cache = self._cache
        return tuple([cache[j.job_id] for j in jobs])  # faster than a generator, at every dispatch

    def update(self, queue: Callable[[], Sequence[JobView]], new: Sequence[JobView]) -> Sequence[JobView]:
        """:meth:`predict` for a caller that keeps a queue's predictions itself (the dispatcher): ``new`` are
        the jobs queued (oldest first) since its previous call, ``queue()`` the whole queue, oldest first,
        which must not be empty. Returns the jobs whose prediction is new — ``new``, or the whole queue
        after a refit — to be read with :meth:`prediction`: the same jobs, computed in the same batches
        (so to the same bits) as ``predict(queue())``, which looks through the whole queue for them at
        every call (O(queue) per dispatch, with thousands queued a third of a simulation's CPU)."""
        jobs = queue() if self._refit_if_due() else new
        self._fill(jobs)
        return jobs

    def prediction(self, job_id: int) -> Prediction:
        """A job's prediction, made by :meth:`predict` or :meth:`update` since the last refit."""
        return self._cache[job_id]

    def _refit_if_due(self) -> bool:
        """Refit once per batch of new observations: after every one while data is scarce, then after
        every ~3% more data (a refit costs ~1 ms; a model of 500 points barely moves with one more), and at
        least every half window: the window holds only the newest observations, so a longer gap would let
        observations (the slowest, censored ones too) pass through it without any fit. True: refitted
        (every prediction made before is forgotten)."""
        if self._dirty and self._pending >= max(1, min(self.observations // 32, len(self._y) // 2)):
            self._refit()
            return True
        return False

    def _fill(self, jobs: Sequence[JobView]) -> None:
        """Predict the jobs not predicted by the current model yet, in one batch (a queued job's prediction
        changes only when the model does: each is computed once per model)."""
        cache = self._cache
        missing = [j for j in jobs if j.job_id not in cache]
        if missing:
            for job, prediction in zip(missing, self._compute(missing), strict=True):
                cache[job.job_id] = prediction

    def _compute(self, jobs: Sequence[JobView]) -> list[Prediction]:
        if self._coef is None:
            base = [Prediction(self.prior_s, "prior")] * len(jobs)
        else:
            rows = self._rows
            for job in jobs:
                if job.job_id not in rows:
                    rows[job.job_id] = self._features(job)
            if len(jobs) <= SMALL_BATCH:  # numpy's per-call overhead dwarfs a few 15-term dot products
                coef, prior = self._coef_list, self._log_prior
                seconds = [
                    min(max(math.exp(min(_dot(rows[j.job_id], coef) + prior, EXP_CAP)), MIN_S), MAX_S)
                    for j in jobs
                ]
            else:
                slot = self._slot
                # the slots first: taking one may grow ``_queued``, which must be read after that
                slots = [slot(j.job_id, rows[j.job_id]) for j in jobs]
                matrix = self._queued[slots]
                log_s = np.minimum(matrix @ self._coef + self._log_prior, EXP_CAP)
                seconds = np.clip(np.exp(log_s), MIN_S, MAX_S).tolist()
            base = [Prediction(s, "ridge") for s in seconds]
        first = self._first
        for i, job in enumerate(jobs):
            if (
                job.resubmission
                and (tools := first.get(job.trajectory_id)) is not None
                and (known := tools.get(job.tool)) is not None
            ):
                base[i] = Prediction(min(max(known, MIN_S), MAX_S), "same_problem_first_evaluation")
        return base


def _dot(row: list[float], coef: list[float]) -> float:
    """The products added left to right from the first: the bits ``sum`` gave on Python 3.11, on every
    Python. (``sum`` of floats compensates rounding errors from 3.12 on: the same features and
    coefficients gave predictions a few ulps apart on 3.11 and 3.12, enough to break a tie the other way
    and make a simulation differ by Python version.) Also faster than ``sum(map(float.__mul__, ...))``."""
    total = 0.0
    for x, c in zip(row, coef, strict=True):
        total += x * c
    return total


def _ridge() -> Any:
    """A ridge fit ``(x, y, alpha) → coefficients`` by scikit-learn's solver, imported lazily (≈ 1 s),
    with BLAS limited to one thread in this process.

    Our fits are tiny (a thousand rows, fifteen columns); a BLAS thread pool gains nothing there, and its
    threads spin after each call, taking a core from the worker processes on a small machine (measured:
    +100 µs on every tool job's round trip on a 2-core VM). The arrays are valid float64 by
    construction, so scikit-learn's per-call parameter validation is skipped: it was ≈ 0.4 ms of a
    ≈ 0.55 ms refit (≈ 1.4 ms of CPU per refit inside a real run on that VM), same coefficients.
    """
    global _RIDGE
    if _RIDGE is None:
        from sklearn import config_context
        from sklearn.linear_model import ridge_regression
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1)

        def fit(x: np.ndarray[Any, Any], y: np.ndarray[Any, Any], alpha: float) -> Any:
            with config_context(skip_parameter_validation=True):
                return ridge_regression(x, y, alpha=alpha, solver="cholesky", check_input=False)

        _RIDGE = fit
    return _RIDGE


_RIDGE: Any = None


def warm_import() -> None:
    """Import scikit-learn now, before a measured window, not in the middle of one; one tiny fit also
    loads the modules the first real fit would import lazily."""
    _ridge()(np.eye(2), np.zeros(2), 1.0)
