"""The whole exception tree of asyncroll.

    AsyncrollError
    ├── UsageError                 bad flags or config; exit code 2
    │   ├── WorkloadError          a workload file is malformed (carries file:line: field: message)
    │   ├── OutputExistsError      --output already exists; nothing is touched
    │   └── FingerprintMismatch*   an experiment resumed or staged under a changed protocol
    ├── OutputWriteError           an output file could not be written (a full disk); exit code 1
    ├── WorkerError                a tool worker could not do its job
    │   ├── WorkerStartupError     a worker did not become ready within its deadline
    │   │   ├── ToolsNotLoaded     its tools did not import
    │   │   └── WorkerOverMemoryCap  it is above --worker-max-rss-mb before any job
    │   ├── WorkerTimeout          a job ran past --tool-timeout; the worker tree was killed
    │   └── WorkerDied             the worker process exited while it held a job
    ├── ModelError                 a model call failed; isolated to its trajectory
    │   └── InvalidActionError     the model answered with an action that does not validate
    ├── PolicyError                a policy chose a job that is not in the queue it was shown (its bug)
    ├── IsolationError*            a sandbox layer lcb_evaluate requires is missing (no weak isolation)
    ├── SandboxError*              the sandbox could not start a test or clean up after one
    └── SimulationError            a sweep's simulated run did not complete (e.g. its policy raised)

(*) defined in the module that raises them: :class:`~asyncroll.experiment.fingerprint.FingerprintMismatch`,
:class:`~asyncroll.evaluator.isolation.IsolationError`, :class:`~asyncroll.evaluator.sandbox.SandboxError`.

CLI-facing errors carry ``exit_code``. Foreign errors are mapped at the boundary and chained
with ``from exc``. :func:`no_directory` and :func:`no_file` word the commonest refusals of a path.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Final

#: The most characters of an error's text anything keeps or shows: an event (``model_failed``,
#: ``cpu_finished``, ``cpu_failed``, ``trajectory_finished``), a tool worker's reply, the text a trajectory
#: fails with (results.jsonl) or shows the model (``--tool-errors observe``), and a script's declared error
#: or failure message, so that a replay writes back whatever a run recorded and gives back the same text.
#: Stdlib only here: the tool worker imports it (:mod:`asyncroll.events` re-exports it).
MAX_ERROR_CHARS: Final = 1000


def error_text(text: str) -> str:
    """``text`` as an error's text is kept and shown: its first :data:`MAX_ERROR_CHARS` characters."""
    return text[:MAX_ERROR_CHARS]


#: The words of the error that fails a run whose server stayed down past ``--server-down-timeout``
#: (the HTTP backend's), by which the CLI knows that error already says the outage.
SERVER_DOWN_SAID = "stayed unavailable for"


def _looked_up(path: str | os.PathLike[str]) -> int | str | None:
    """``path``'s mode; else the system's reason it cannot be looked up (a symlink loop, a folder on the
    way that may not be searched, a name too long); None where it does not exist (a dangling symlink, a
    file on the way, a NUL character)."""
    try:
        return os.stat(path).st_mode
    except OSError as exc:
        return None if exc.errno in (errno.ENOENT, errno.ENOTDIR) or not exc.strerror else exc.strerror
    except ValueError:  # a NUL character
        return None


def no_directory(path: str | os.PathLike[str]) -> str:
    """Why ``path``, which is no directory, cannot be used as one: "does not exist" (a dangling symlink
    too), "not a directory" (a file, a pipe...), or the system's reason it cannot be looked up (a symlink
    loop, a folder on the way that may not be searched, a name too long), which was "does not exist"."""
    found = _looked_up(path)
    return "does not exist" if found is None else found if isinstance(found, str) else "not a directory"


def no_file(path: str | os.PathLike[str], what: str) -> str:
    """Why ``path``, which is no regular file, cannot be used as ``what``: "no such file" (a dangling
    symlink too), "is a directory, not WHAT", "not a regular file", or the system's reason it cannot be
    looked up (as :func:`no_directory`)."""
    found = _looked_up(path)
    if found is None or isinstance(found, str):
        return "no such file" if found is None else found
    return f"is a directory, not {what}" if stat.S_ISDIR(found) else "not a regular file"


class AsyncrollError(Exception):
    """Base class of every error asyncroll raises on purpose."""

    exit_code: int = 1


class UsageError(AsyncrollError):
    """Invalid flags, config or inputs, found before anything started."""

    exit_code = 2


class WorkloadError(UsageError):
    """One or more problems in a workload file, each formatted ``FILE:LINE: field: message``; the message
    ends with ``summary`` where there is one (``FILE: 4 errors in 3 of 10 workload lines``)."""

    def __init__(self, problems: list[str], summary: str | None = None) -> None:
        self.problems = list(problems)
        super().__init__("\n".join([*self.problems, *([summary] if summary else [])]))


class OutputExistsError(UsageError):
    """The output directory exists; asyncroll never overwrites a run. One message for every command that
    makes a run directory (run, simulate, a replay, a sweep), naming the path and the way out."""

    def __init__(self, output: object, where: str | None = None) -> None:
        # ``where``: the setting's source when not the flag (a config file's ``output``)
        named = f"--output {output}" if where is None else f"{where} ({output})"
        super().__init__(f"{named} already exists; asyncroll never overwrites a run (choose a new directory)")
        self.output, self.where = output, where

    def __reduce__(self) -> tuple[type[OutputExistsError], tuple[object, str | None]]:
        # rebuilt from its output, not its message (pickled across a process pool, or copied)
        return type(self), (self.output, self.where)


class OutputWriteError(AsyncrollError):
    """An output file (a run's, a conversion's) could not be written: its message names the file and the
    reason. Not a usage error: the same command succeeds once there is room."""


class WorkerError(AsyncrollError):
    """A tool worker failed to do its job."""


class WorkerStartupError(WorkerError):
    """A worker failed to import its tools or answer the dummy call in time.

    ``retry`` is true when the worker was killed by a signal from outside while it started (the OOM
    killer, an operator): not its own failure, so a fresh worker is worth another try. A worker that
    could not load its tools, exited by itself or did not answer in time fails the same way again."""

    def __init__(self, message: str, *, retry: bool = False) -> None:
        super().__init__(message)
        self.retry = retry


class ToolsNotLoaded(WorkerStartupError):
    """The worker started but could not load its tools (an import error, a tool file whose bytes no longer
    have the hash the run recorded). Never worth another start: the next one reads the same files."""


class WorkerOverMemoryCap(WorkerStartupError):
    """A worker that started holds more resident memory than --worker-max-rss-mb before any job: each
    of its jobs would have it replaced. Never worth another start: the next one imports the same tools."""


class WorkerTimeout(WorkerError):
    """A job exceeded the tool timeout; the worker's process tree was killed."""


class WorkerDied(WorkerError):
    """The worker process exited while it held a job (or was found dead)."""


class ModelError(AsyncrollError):
    """A model request failed (transport, timeout, HTTP status or invalid action)."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        status: int | None = None,
        response_received: bool | None = None,
        parse_s: float | None = None,
        attempts: int = 1,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        text: str | None = None,
        finish_reason: str | None = None,
        scripted: bool = False,
    ) -> None:
        """``kind`` classifies the failure (``transport``, ``timeout``, ``http_status``, ``bad_response``,
        ``schema_rejected``, ``invalid_action``, ...). HTTP backends also say what they saw: the status
        code, whether a complete response arrived, the seconds spent parsing it, how many attempts were
        made (retries included), and the token usage, text and finish reason of a completion whose
        action was invalid (the server did that work; a transcript shows what the model wrote).
        ``scripted``: a script's ``error`` step failed it (no request was sent anywhere)."""
        self.kind = kind
        self.status = status
        self.response_received = response_received
        self.parse_s = parse_s
        self.attempts = attempts
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.text = text
        self.finish_reason = finish_reason
        self.scripted = scripted
        super().__init__(message)


class PolicyError(AsyncrollError):
    """A policy's ``choose`` named a job that is not in the queue it was shown: a bug in that policy
    (the built-in ones choose from the snapshot). The run fails with this message, not a bare KeyError."""


class InvalidActionError(ModelError):
    """The model's response did not parse or validate as an action."""

    def __init__(self, message: str, *, status: int | None = None, parse_s: float | None = None) -> None:
        super().__init__(
            "invalid_action", message, status=status, response_received=status is not None, parse_s=parse_s
        )


class SimulationError(AsyncrollError):
    """A simulated run inside a sweep ended ``failed``: its numbers would mean nothing, so the sweep
    stops and names the cell."""
