"""The trajectory loop: model turn → action → CPU job → observation, until an answer or ``max_turns``.

A model failure or a failed tool job ends only its own trajectory (``failed`` with the error); the run
goes on. Errors that are not asyncroll's own (bugs) are not swallowed here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from asyncroll.backends.base import Backend, ModelRequest
from asyncroll.clock import Clock
from asyncroll.coerce import CoercionError, coerce_arguments
from asyncroll.errors import InvalidActionError, ModelError
from asyncroll.events import EventLog, TrajectoryFinished, TrajectoryStarted
from asyncroll.runtime.dispatcher import CpuDispatcher, JobSpec
from asyncroll.runtime.model_gate import ModelGate
from asyncroll.workload import FinalAction, Problem, SubmitAction, ToolAction

GRADE_TOOL = "__grade__"
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

    def to_json(self) -> dict[str, Any]:
        return {
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
    ) -> None:
        self._backend = backend
        self._gate = gate
        self._dispatcher = dispatcher
        self._clock = clock
        self._events = events
        self._max_turns = max_turns
        self._tool_errors = tool_errors

    async def run(self, index: int, traj_id: str, problem: Problem, active: int) -> TrajectoryResult:
        started = self._clock.now()
        self._events.emit(
            TrajectoryStarted(id=traj_id, index=index, prompt_chars=len(problem.prompt), active=active)
        )
        state = _State(traj_id, index, started)
        messages: list[dict[str, Any]] = [{"role": "user", "content": problem.prompt}]
        try:
            result = await self._loop(state, problem, messages)
        except _Failed as exc:
            result = state.finish(self._clock.now(), "failed", error=str(exc))
        except ModelError as exc:
            result = state.finish(self._clock.now(), "failed", error=f"model {exc.kind}: {exc}")
        self._events.emit(
            TrajectoryFinished(
                id=traj_id,
                status=result.status,
                turns=result.turns,
                tool_calls=result.tool_calls,
                duration_s=result.duration_s,
                correct=result.correct,
                error=result.error,
            )
        )
        return result

    async def _loop(
        self, state: _State, problem: Problem, messages: list[dict[str, Any]]
    ) -> TrajectoryResult:
        for turn in range(self._max_turns):
            state.turns = turn + 1
            request = ModelRequest(state.id, problem, turn, messages)
            response = await self._gate.call(state.id, turn, partial(self._backend.complete, request))
            action = response.action
            messages.append({"role": "assistant", "action": action})
            if isinstance(action, ToolAction):
                observation, error = await self._tool(state, problem, action, turn)
                if error is not None and self._tool_errors == "fail":
                    return state.finish(self._clock.now(), "failed", error=error)
                messages.append({"role": "tool", "content": observation})
            elif isinstance(action, FinalAction):
                correct = await self._grade(state, problem, action, turn)
                return state.finish(self._clock.now(), "completed", answer=action.answer, correct=correct)
            elif isinstance(action, SubmitAction):
                raise InvalidActionError(
                    "'submit' actions need the one-repair protocol, which has not landed"
                )
        return state.finish(self._clock.now(), "max_turns")

    async def _tool(
        self, state: _State, problem: Problem, action: ToolAction, turn: int
    ) -> tuple[str, str | None]:
        tool = problem.tool(action.name)
        if tool is None:
            raise InvalidActionError(f"unknown tool {action.name!r}")
        try:
            arguments = coerce_arguments(action.arguments, tool.declared_inputs, tool.bound_arguments)
        except CoercionError as exc:
            raise InvalidActionError(f"tool {action.name!r} arguments{exc.path}: {exc.message}") from exc
        arg_bytes = len(json.dumps(action.arguments, default=str))
        cost_s = None if action.cpu_ms is None else action.cpu_ms / 1000.0
        resubmission = tool.key in state.tools_run
        state.tools_run.add(tool.key)
        spec = JobSpec(state.id, "tool", tool.key, arguments, turn, arg_bytes, cost_s, resubmission)
        outcome = await self._dispatcher.run(spec)
        state.tool_calls += 1
        if outcome.ok:
            return json.dumps(outcome.value, default=str), None
        error = f"tool {action.name!r} failed: {outcome.error}"
        return error, error

    async def _grade(self, state: _State, problem: Problem, action: FinalAction, turn: int) -> bool | None:
        if problem.reference_answer is None:
            return None
        answer = action.answer if isinstance(action.answer, str) else json.dumps(action.answer)
        arguments = {"answer": answer, "reference": problem.reference_answer}
        outcome = await self._dispatcher.run(
            JobSpec(state.id, "grade", GRADE_TOOL, arguments, turn, len(answer))
        )
        if not outcome.ok:
            raise _Failed(f"grading failed: {outcome.error}")
        return bool(outcome.value)


class _Failed(Exception):
    """Ends this trajectory as ``failed`` with the message (a failed grade job, for one)."""


@dataclass(slots=True)
class _State:
    id: str
    index: int
    started: float
    turns: int = 0
    tool_calls: int = 0
    tools_run: set[str] = field(default_factory=set)

    def finish(
        self,
        now: float,
        status: Status,
        *,
        answer: Any = None,
        correct: bool | None = None,
        error: str | None = None,
    ) -> TrajectoryResult:
        return TrajectoryResult(
            self.id,
            self.index,
            status,
            self.turns,
            self.tool_calls,
            round(now - self.started, 6),
            answer,
            correct,
            error,
        )
