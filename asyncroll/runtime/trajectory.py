"""The trajectory loop: model turn → action → CPU job → observation, until an answer or ``max_turns``.

A model failure or a failed tool job ends only its own trajectory (``failed`` with the error); the run
goes on. With ``--tool-errors observe`` a failed tool job's error is the model's observation instead, and
the trajectory goes on. Errors that are not asyncroll's own (bugs) are not swallowed here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal

from asyncroll.backends.action_schema import tool_call
from asyncroll.backends.base import Backend, ModelRequest
from asyncroll.clock import Clock
from asyncroll.config import DEFAULT_MAX_OBSERVATION_CHARS
from asyncroll.errors import InvalidActionError, ModelError, error_text
from asyncroll.event_log import EventLog
from asyncroll.events import TrajectoryFinished, TrajectoryStarted
from asyncroll.runtime.dispatcher import CpuDispatcher
from asyncroll.runtime.jobs import JobSpec
from asyncroll.runtime.model_gate import ModelGate
from asyncroll.runtime.transcript import assistant_message, invalid_reply
from asyncroll.workers.protocol import JSON_TEXT
from asyncroll.workload import EVALUATOR_TOOL, FinalAction, OneRepair, Problem, SubmitAction, ToolAction

GRADE_TOOL = "__grade__"


def cut_observation(head: str, chars: int) -> str:
    """The first characters of a ``chars``-long tool result, and a line that tells the model it was cut:
    a result a model's context cannot hold would fail the rest of the trajectory at the server, on
    every turn."""
    return f"{head}\n[tool result cut: the first {len(head):,} of {chars:,} characters]"


Status = Literal["completed", "failed", "max_turns"]


@dataclass(frozen=True, slots=True)
class TrajectoryResult:
    id: str
    index: int
    status: Status
    turns: int
    tool_calls: int
    duration_s: float
    answer: Any = None
    correct: bool | None = None
    error: str | None = None
    evaluation: Evaluation | None = None  # one-repair problems only
    #: the conversation, with --transcripts (:func:`asyncroll.runtime.transcript.transcript_line`)
    messages: list[dict[str, Any]] | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        out = {
            "id": self.id,
            "index": self.index,
            "status": self.status,
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "duration_s": self.duration_s,
            "answer": self.answer,
            "correct": self.correct,
            "error": self.error,
        }
        if self.evaluation is not None:
            out.update(self.evaluation.to_json())
        return out


@dataclass(frozen=True, slots=True)
class Evaluation:
    """What a one-repair trajectory's results record (counts only: never the hidden tests or feedback)."""

    passed: bool
    repair_attempted: bool
    generations: int
    tests_run: int
    tests_total: int
    timed_out: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "repair_attempted": self.repair_attempted,
            "generations": self.generations,
            "tests_run": self.tests_run,
            "tests_total": self.tests_total,
            "timed_out": self.timed_out,
        }


class TrajectoryRunner:
    def __init__(
        self,
        backend: Backend,
        gate: ModelGate,
        dispatcher: CpuDispatcher,
        clock: Clock,
        events: EventLog,
        *,
        max_turns: int,
        tool_errors: Literal["fail", "observe"],
        evaluator_options: dict[str, Any] | None = None,
        max_observation_chars: int = DEFAULT_MAX_OBSERVATION_CHARS,
        transcripts: bool = False,
    ) -> None:
        """``evaluator_options``: extra arguments of every ``lcb_evaluate`` call (the run's settings:
        :func:`asyncroll.runtime.collaborators.evaluator_options`), bound like the hidden tests.
        ``max_observation_chars``: a tool's result (as JSON text) longer than this reaches the model cut
        to it, with a note saying so (:func:`cut_observation`), and is counted; the worker encodes and
        cuts it (``JobRequest.observation_chars``). ``transcripts``: each result carries its conversation
        (``messages``) for ``transcripts.jsonl``."""
        self._backend = backend
        self._gate = gate
        self._dispatcher = dispatcher
        self._clock = clock
        self._events = events
        self._max_turns = max_turns
        self._tool_errors = tool_errors
        self._evaluator_options = dict(evaluator_options or {})
        self._max_observation_chars = max_observation_chars
        self._transcripts = transcripts
        self.last_end: float | None = None  # when the latest trajectory ended (its clock's time)

    def window_end(self, complete: bool) -> float:
        """When the measured window ends: a complete run's at its last trajectory's end (the makespan
        is that, as the events say; what the event loop ran after it, such as the kill of a worker whose
        job timed out, is outside it), any other run's now (its stop has ended its work)."""
        return self.last_end if complete and self.last_end is not None else self._clock.now()

    async def run(self, index: int, traj_id: str, problem: Problem, active: int) -> TrajectoryResult:
        started = self._clock.now()
        self._events.emit(
            TrajectoryStarted(id=traj_id, index=index, prompt_chars=len(problem.prompt), active=active),
            at=started,
        )
        state = _State(traj_id, index, started)
        messages: list[dict[str, Any]] = [{"role": "user", "content": problem.prompt}]
        try:
            result = await self._loop(state, problem, messages)
        except _Failed as exc:
            result = state.finish(self._clock.now(), "failed", error=str(exc))
        except ModelError as exc:
            result = state.finish(self._clock.now(), "failed", error=f"model {exc.kind}: {exc}")
            if (reply := invalid_reply(state.turns - 1, exc)) is not None:  # what the model wrote
                messages.append(reply)
        finally:
            self._dispatcher.trajectory_ended(traj_id)
        if self._transcripts:
            result = replace(result, messages=messages)
        self._events.emit(
            TrajectoryFinished(
                id=traj_id,
                status=result.status,
                turns=result.turns,
                tool_calls=result.tool_calls,
                duration_s=result.duration_s,
                correct=result.correct,
                error=result.error,
                generations=None if result.evaluation is None else result.evaluation.generations,
                observations_cut=state.observations_cut,
                # a code problem is judged by its tests (one_repair), whatever reference it carries
                has_reference=problem.reference_answer is not None and problem.protocol != "one_repair",
            ),
            at=state.ended,  # when its duration ends
        )
        if state.ended is not None:
            self.last_end = state.ended if self.last_end is None else max(self.last_end, state.ended)
        return result

    async def _loop(
        self, state: _State, problem: Problem, messages: list[dict[str, Any]]
    ) -> TrajectoryResult:
        for turn in range(self._max_turns):
            state.turns = turn + 1
            request = ModelRequest(state.id, problem, turn, messages)
            response = await self._gate.call(state.id, turn, partial(self._backend.complete, request))
            action = response.action
            messages.append(assistant_message(turn, response))
            if isinstance(action, ToolAction):
                observation, error = await self._tool(state, problem, action, turn)
                if error is not None and self._tool_errors == "fail":
                    return state.finish(self._clock.now(), "failed", error=error)
                messages.append({"role": "tool", "content": observation, "turn": turn, "name": action.name})
            elif isinstance(action, FinalAction):
                correct = await self._grade(state, problem, action, turn)
                return state.finish(self._clock.now(), "completed", answer=action.answer, correct=correct)
            elif isinstance(action, SubmitAction):
                protocol = problem.one_repair
                if protocol is None:
                    raise InvalidActionError("'submit' is only valid under the one-repair protocol")
                try:
                    verdict = await self._evaluate(state, protocol, action, turn)
                except _Failed:
                    if state.evaluation is not None:  # the repair was submitted; its evaluation failed
                        state.evaluation = replace(state.evaluation, repair_attempted=True)
                    raise
                state.generations += 1
                passed = verdict.get("passed") is True
                state.evaluation = Evaluation(  # kept if the trajectory ends before its repair is judged
                    passed,
                    state.generations > 1,
                    state.generations,
                    int(verdict.get("tests_run", 0)),
                    int(verdict.get("tests_total", len(protocol.tests))),
                    bool(verdict.get("timed_out", False)),
                )
                if passed or state.generations >= protocol.max_generations:
                    return state.finish(self._clock.now(), "completed", correct=passed)
                if turn + 1 == self._max_turns:  # no turn sends it: its failing (hidden) case stays unshown
                    break
                feedback = format_feedback(verdict.get("feedback"))
                repair = f"{protocol.repair_instruction}\n\n{feedback}"
                messages.append({"role": "user", "content": repair, "turn": turn})
        return state.finish(self._clock.now(), "max_turns")

    async def _evaluate(
        self, state: _State, protocol: OneRepair, action: SubmitAction, turn: int
    ) -> dict[str, Any]:
        """One evaluation of submitted code on the problem's hidden tests, as a CPU job."""
        arguments: dict[str, Any] = {"code": action.code, "tests": protocol.tests, **self._evaluator_options}
        if protocol.func_name is not None:
            arguments["func_name"] = protocol.func_name
        cost_s = None if action.cpu_ms is None else action.cpu_ms / 1000.0
        code_bytes = len(action.code.encode())
        spec = JobSpec(
            state.id,
            "evaluate",
            EVALUATOR_TOOL,
            arguments,
            turn,
            code_bytes,
            cost_s,
            resubmission=state.generations > 0,
            n_tests=len(protocol.tests),
            test_bytes=protocol.test_bytes,
            code_bytes=code_bytes,
            declared=None if action.passes is None else _declared_verdict(action.passes, len(protocol.tests)),
            declared_error=action.raises,
            declared_death=action.worker_dies,
        )
        outcome = await self._dispatcher.run(spec)  # a submission, not a tool call: ``generations`` counts it
        if not outcome.ok:
            raise _Failed(f"evaluation failed: {outcome.error}")
        if not isinstance(outcome.value, dict):
            raise _Failed(f"evaluation returned {type(outcome.value).__name__}, not a verdict")
        return outcome.value

    async def _tool(
        self, state: _State, problem: Problem, action: ToolAction, turn: int
    ) -> tuple[str, str | None]:
        tool, arguments = tool_call(problem, action)
        # UTF-8 bytes, as every size the predictor reads (an escaped ``\u00fc`` took 6 where UTF-8 takes 2);
        # a lone surrogate a model's JSON may carry is counted, not an error
        arg_bytes = len(JSON_TEXT.encode(action.arguments).encode("utf-8", "surrogatepass"))
        cost_s = None if action.cpu_ms is None else action.cpu_ms / 1000.0
        resubmission = tool.key in state.tools_run
        state.tools_run.add(tool.key)
        spec = JobSpec(
            state.id,
            "tool",
            tool.key,
            arguments,
            turn,
            arg_bytes,
            cost_s,
            resubmission,
            observation_chars=self._max_observation_chars,
            declared_error=action.raises,
            declared_death=action.worker_dies,
        )
        outcome = await self._dispatcher.run(spec)
        state.tool_calls += 1
        if outcome.ok:
            text, chars = outcome.value  # encoded and cut by the worker (JobRequest.observation_chars)
            if chars > len(text):
                state.observations_cut += 1
                text = cut_observation(text, chars)
            return text, None
        # what the trajectory sees of it (results.jsonl, the observation) is what events keep: a replay
        # gives back the same text
        error = error_text(f"tool {action.name!r} failed: {outcome.error}")
        if self._tool_errors == "observe" and len(error) > self._max_observation_chars:
            state.observations_cut += 1  # the error is the model's observation: cut as a result is
            return cut_observation(error[: self._max_observation_chars], len(error)), error
        return error, error

    async def _grade(self, state: _State, problem: Problem, action: FinalAction, turn: int) -> bool | None:
        if problem.reference_answer is None:
            return None
        answer = action.answer if isinstance(action.answer, str) else json.dumps(action.answer)
        arguments = {"answer": answer, "reference": problem.reference_answer}
        outcome = await self._dispatcher.run(
            JobSpec(state.id, "grade", GRADE_TOOL, arguments, turn, len(answer.encode()))
        )
        if not outcome.ok:
            raise _Failed(f"grading failed: {outcome.error}")
        return bool(outcome.value)


#: The feedback fields shown as blocks of their own (their text may span lines), in this order.
_FEEDBACK_BLOCKS = ("input", "expected", "got", "error")


def format_feedback(feedback: Any) -> str:
    """The first failing case as the repair turn shows it to the model: a heading, then each field under
    its label with its lines as they are (``input``, ``expected``, ``got``, ``error``), then ``detail``::

        Failed test #0: wrong_answer
        input:
        6
        abc
        expected:
        YES
        ...
        detail: mismatched output length: got 1 lines, expected 6

    Anything but the evaluator's feedback object (a simulated verdict's text, say) is shown as text."""
    if not isinstance(feedback, dict):
        return "" if feedback is None else str(feedback)
    test, verdict = feedback.get("test"), feedback.get("verdict")
    lines = [
        "Failed test" + ("" if test is None else f" #{test}") + ("" if verdict is None else f": {verdict}")
    ]
    for key in _FEEDBACK_BLOCKS:
        value = feedback.get(key)
        if value is not None:
            text = str(value).rstrip("\n")
            lines.append(f"{key}:\n{text}" if text else f"{key}: (empty)")
    for key, value in feedback.items():
        if key not in (*_FEEDBACK_BLOCKS, "test", "verdict") and value is not None:
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


def _declared_verdict(passes: bool, tests: int) -> dict[str, Any]:
    """The verdict a simulated worker returns for a submission whose script declares ``passes``."""
    return {
        "passed": passes,
        "tests_run": tests if passes else 1,
        "tests_total": tests,
        "feedback": None if passes else "(simulated) the declared verdict of this submission is a failure",
        "timed_out": False,
    }


class _Failed(Exception):
    """Ends this trajectory as ``failed`` with the message (a failed grade job, for one)."""


@dataclass(slots=True)
class _State:
    id: str
    index: int
    started: float
    turns: int = 0
    tool_calls: int = 0
    observations_cut: int = 0  # tool results cut to --max-observation-chars
    tools_run: set[str] = field(default_factory=set)
    generations: int = 0  # one-repair: programs evaluated so far
    #: one-repair: the verdict on the last program evaluated. A trajectory that ends after one (its
    #: repair request failed, a tool or the next evaluation failed, max_turns) keeps it: correct is
    #: whether that program passed. Dropped, it left one_repair's and accuracy's denominators, and
    #: every such failure (all of a first program that failed) raised the pass rates.
    evaluation: Evaluation | None = None
    ended: float | None = None  # the clock when it finished

    def finish(
        self,
        now: float,
        status: Status,
        *,
        answer: Any = None,
        correct: bool | None = None,
        error: str | None = None,
    ) -> TrajectoryResult:
        evaluation = self.evaluation
        if correct is None and evaluation is not None:
            correct = evaluation.passed
        self.ended = now
        return TrajectoryResult(
            self.id,
            self.index,
            status,
            self.turns,
            self.tool_calls,
            round(now - self.started, 6),
            answer,
            correct,
            None if error is None else error_text(error),  # as trajectory_finished keeps it
            evaluation,
        )
