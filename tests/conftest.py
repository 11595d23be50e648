"""Shared test helpers: workloads written to real files, runs on a virtual clock, loopback ``/metrics``
servers."""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import typer
import typer.main
import typer.testing
from typer.testing import CliRunner, Result

from asyncroll.clock import VirtualClock
from asyncroll.config import build_config
from asyncroll.event_log import EventCapture
from asyncroll.runtime.run import Run, RunOutcome, prepare
from asyncroll.runtime.virtual_worker import Duration, builtin_duration, virtual_factory

if TYPE_CHECKING:  # imported where used: tests.metrics_loopback imports this module
    from tests.metrics_loopback import MetricsServer, Raw

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_columns_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The progress lines take their width from ``COLUMNS`` when it is set: every test sees the width of
    its terminal (a pseudo-terminal's, or none), whatever the shell running the suite exported."""
    monkeypatch.delenv("COLUMNS", raising=False)


def write_workload(path: Path, problems: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(p) + "\n" for p in problems), encoding="utf-8")
    return path


def tool_problem(
    pid: str,
    *,
    model_ms: float,
    cpu_ms: float,
    turns: int = 1,
    final_ms: float | None = None,
    tool: str = "sleep_ms",
) -> dict[str, Any]:
    """A problem with ``turns`` tool calls of ``cpu_ms`` each, model turns of ``model_ms``, then a final."""
    script: list[dict[str, Any]] = [
        {"type": "tool", "name": tool, "arguments": {"milliseconds": cpu_ms}, "latency_ms": model_ms}
        for _ in range(turns)
    ]
    script.append({"type": "final", "answer": "ok", "latency_ms": model_ms if final_ms is None else final_ms})
    return {"id": pid, "prompt": f"problem {pid}", "tools": [{"name": tool}], "script": script}


def _registered(typer_app: typer.Typer) -> tuple[object, ...]:
    """Every command and group registered on ``typer_app`` and its sub-apps, with the callback and class
    of each (a test may replace them in place): the objects themselves, which the cache's key holds, so a
    command registered later never matches one gone before it whose ``id`` it took."""
    parts: list[object] = [typer_app, typer_app.registered_callback]
    for command in typer_app.registered_commands:
        parts += (command, command.callback, command.cls)
    for group in typer_app.registered_groups:
        parts += (group, group.typer_instance)
        if isinstance(group.typer_instance, typer.Typer):
            parts.extend(_registered(group.typer_instance))
    return tuple(parts)


_BUILT: dict[tuple[object, ...], Any] = {}


def _command_built_once(typer_app: typer.Typer) -> Any:
    """typer's click command for ``typer_app``, built once per set of registered commands. typer builds it
    afresh at each ``CliRunner().invoke`` (every command's signature and annotations read again: ≈ 0.2 s,
    most of an in-process ``simulate`` of a small workload, hundreds of them in the property tests); the
    real CLI builds it once per process, as this does. A command registered later builds another."""
    key = _registered(typer_app)
    if key not in _BUILT:
        _BUILT[key] = typer.main.get_command(typer_app)
    return _BUILT[key]


def invoke(*args: str | Path) -> Result:
    """``asyncroll ARGS`` in this process: for what needs no interpreter of its own (refusals, warnings,
    virtual-clock commands); each command keeps at least one test through a real subprocess."""
    from asyncroll.cli import app

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(typer.testing, "_get_command", _command_built_once)
        return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A completed simulated run of the smoke workload (no process, no server), once per module; a module
    that needs another recorded run defines its own ``recorded``."""
    run = tmp_path_factory.mktemp("recorded") / "run"
    done = invoke("simulate", "--workload", REPO / "examples" / "smoke.jsonl", "--output", run)
    assert done.exit_code == 0, done.output
    return run


VirtualRun = Callable[..., tuple[RunOutcome, EventCapture, Path]]


@pytest.fixture
def virtual_run(tmp_path: Path) -> VirtualRun:
    """Run a workload through the real runtime on a virtual clock with virtual workers."""
    counter = iter(range(1_000_000))

    def go(
        problems: list[dict[str, Any]],
        duration: Duration = builtin_duration,
        *,
        simulate_tools: bool = False,
        tool_files: dict[str, str] | None = None,
        **settings: Any,
    ) -> tuple[RunOutcome, EventCapture, Path]:
        n = next(counter)
        for name, source in (tool_files or {}).items():
            (tmp_path / name).write_text(source)
        workload = write_workload(tmp_path / f"w{n}.jsonl", problems)
        out = tmp_path / f"run{n}"
        cfg = build_config({"workload": workload, "output": out, **settings})
        clock = VirtualClock()
        capture = EventCapture()
        run = Run(
            prepare(cfg, ["test"]),
            clock,
            worker_factory=virtual_factory(clock, duration, simulate_tools=simulate_tools),
            subscribers=(capture,),
        )
        outcome = clock.run(run.execute())
        return outcome, capture, out

    return go


@pytest.fixture
def metrics_server() -> Iterator[Callable[..., MetricsServer]]:
    from tests.metrics_loopback import MetricsServer

    servers: list[MetricsServer] = []

    def start(render: Callable[[int], tuple[int, str]], raw: Raw | None = None) -> MetricsServer:
        server = MetricsServer(render, raw).__enter__()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.__exit__()


@pytest.fixture(scope="module")
def versions_read_once() -> Iterator[None]:
    """Each run's receipt (run.json's ``versions``) names the installed packages as this process first
    read them, for a module of property tests that simulate hundreds of runs in this process and check
    their events and summaries, never their receipt's versions: ``importlib.metadata`` read every
    package's metadata again for each run (40–85 ms a run, a quarter of a round-trip example). The
    product reads them afresh on purpose (an experiment's runner sees a package upgraded mid-way)."""
    from asyncroll.outputs import receipt
    from asyncroll.runtime import receipt_body

    first = receipt.versions()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(receipt_body, "versions", lambda: dict(first))
        yield


@pytest.fixture(scope="module")
def hypothesis_without_local_constants() -> Iterator[None]:
    """Derandomised Hypothesis tests that try the same examples whatever ran before them in the process.

    From 6.131 Hypothesis draws some values (5 %) from the literals of every local module imported so
    far (``hypothesis.internal.conjecture.providers._get_local_constants``: ``asyncroll`` and ``tests``
    here), so a property test run alone tried other examples than the same test after other test files
    had imported more modules: a failure found in one order could not be reproduced in another. No
    setting turns that off; this module-long patch makes the pool empty (Hypothesis's own constants
    stay). A Hypothesis without the function (the pinned floor, 6.100) has no such pool: nothing to do."""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants
    except ImportError:  # a Hypothesis before the pool (the 6.100 floor) or one that moved it
        yield
        return
    if not hasattr(providers, "_get_local_constants"):
        yield
        return
    empty = Constants()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(providers, "_get_local_constants", lambda: empty)
        providers.CONSTANTS_CACHE.cache.clear()  # pools drawn from the modules' constants so far
        yield
    providers.CONSTANTS_CACHE.cache.clear()


@pytest.fixture
def sighup_not_ignored() -> Iterator[None]:
    """For a test that expects SIGHUP to stop a command: under ``nohup`` SIGHUP is ignored in this process
    and in every process it starts, and asyncroll rightly keeps an ignored SIGHUP ignored (what the user of
    ``nohup`` asked for), so such a test failed there. SIGHUP takes its default action for the test and
    the processes it starts; the inherited disposition comes back after it."""
    with _not_ignored(signal.SIGHUP, signal.SIG_DFL):
        yield


@pytest.fixture
def sigint_not_ignored() -> Iterator[None]:
    """For a test that expects SIGINT to stop a command or a child: a shell script's background job
    (``pytest … &``, ``nohup pytest … &``) starts with SIGINT ignored, as POSIX has it, and so does
    every process it starts, and asyncroll rightly keeps an ignored SIGINT ignored; such a test failed
    there (a signalled command exit 0 instead of 130, a child that never stopped). Python's own handler
    takes it for the test (its children start with the default action); the ignoring comes back after."""
    with _not_ignored(signal.SIGINT, signal.default_int_handler):
        yield


@contextlib.contextmanager
def _not_ignored(sig: signal.Signals, handler: Any) -> Iterator[None]:
    """``handler`` takes ``sig`` inside where this process was started ignoring it; ignored again after."""
    if signal.getsignal(sig) is not signal.SIG_IGN:
        yield
        return
    signal.signal(sig, handler)
    try:
        yield
    finally:
        signal.signal(sig, signal.SIG_IGN)
