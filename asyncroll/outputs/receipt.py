"""``run.json``: the run's receipt, rewritten atomically at every status change.

``preparing → running → complete | failed | interrupted``. It names everything needed to judge or repeat
the run: the config, versions, host, the workload's SHA-256, a hash of every trusted tool file, and the
isolation in force. Writes go to a temporary file in the same directory and are renamed over the old one,
so a reader never sees half a receipt.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import sys
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import psutil

from asyncroll import __version__
from asyncroll.code_identity import code_version_once
from asyncroll.cpus import quota_cpus, usable_cpus
from asyncroll.errors import OutputWriteError
from asyncroll.json_checks import json_error_text
from asyncroll.json_depth import json_loads
from asyncroll.outputs.lines import clear_staged, open_staged, staging_path, write_all

Status = Literal["preparing", "running", "complete", "failed", "interrupted"]
RECEIPT_SCHEMA_VERSION = 1
#: A run's exit code (recorded in run.json): 0 complete, 1 failed, 2 usage error, 130 interrupted; an
#: experiment's too (1: incomplete). The one table of them.
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def exit_code(status: Status) -> int:
    """The exit code of a run that ended with ``status``."""
    return {"complete": EXIT_OK, "interrupted": EXIT_INTERRUPTED}.get(status, EXIT_FAILED)


#: The libraries whose versions a receipt records: the runtime's (orjson writes every output line, httpcore
#: and h11 carry every model request, click parses the flags, starlette and uvicorn serve serve-sim, an
#: experiment's simulated server; nvidia-ml-py reads the GPU), and every one whose code decides a
#: simulated result (the predictor's ridge fit: scikit-learn, NumPy, SciPy and the BLAS threadpoolctl pins).
_PACKAGES = (
    "anyio",
    "httpx",
    "httpcore",
    "h11",
    "pydantic",
    "typer",
    "click",
    "orjson",
    "psutil",
    "prometheus-client",
    "starlette",
    "uvicorn",
    "nvidia-ml-py",
    "scikit-learn",
    "numpy",
    "scipy",
    "threadpoolctl",
)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` to a temporary file next to ``path``, then rename it over ``path``: a reader sees the
    old file or the new one, never half of one. A failed write (a full disk) removes the temporary file
    and raises."""
    tmp = staging_path(path)
    try:
        with open_staged(tmp, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=False, default=str)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        clear_staged(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.filename is None or exc.filename == str(tmp):  # a full disk says nothing of which file
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _rewrite_in_place(path: Path, data: Any) -> bool:
    """Overwrite ``path`` with ``data`` as JSON (indented, else compact) within the bytes it already
    holds; False, with the file untouched, when neither fits (or it cannot be opened). A write that
    fails once begun (an I/O error) raises :class:`OutputWriteError`: the file may then be cut short."""
    indented = json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"
    compact = json.dumps(data, separators=(",", ":"), sort_keys=False, default=str) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))  # a link: staged and renamed instead
    except OSError:
        return False
    try:
        size = os.fstat(fd).st_size
        text = next((t.encode() for t in (indented, compact) if len(t.encode()) <= size), None)
        if text is None:
            return False
        try:
            write_all(fd, text, 0)
            os.ftruncate(fd, len(text))
            os.fsync(fd)
        except OSError as exc:
            raise OutputWriteError(
                f"run.json: cannot rewrite it in place ({exc.strerror or exc}); it may be cut short"
            ) from exc
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def record_regenerated_exports(run_dir: Path, exports: dict[str, Any]) -> str | None:
    """Add ``exports_regenerated`` (when, by which version and code, each export's result) to a finished run's
    run.json after ``asyncroll timeline`` wrote its exports again, beside the run's own ``exports``, which
    may say they failed (a full disk) or hold an older version's. None, or why run.json was left as it
    was (none, not a receipt, not writable): the exports are written either way."""
    path = run_dir / "run.json"
    try:
        receipt = json_loads(path.read_bytes())
    except FileNotFoundError:
        return f"no {path}: nothing to record the new exports in"
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc}); left as it was"
    except json.JSONDecodeError as exc:  # not "(JSONDecodeError: ...)": Python's class, not the file's fault
        return f"{path} is not valid JSON ({exc.msg}, line {exc.lineno}, column {exc.colno}); left as it was"
    except (ValueError, RecursionError) as exc:  # not UTF-8, a digit limit; RecursionError: nested too deeply
        return f"{path} is not readable JSON ({json_error_text(exc) or exc}); left as it was"
    if not isinstance(receipt, dict):
        return f"{path} is not a receipt (not a JSON object); left as it was"
    # ``code`` as run.json's: every checkout is version 0.1.0, and the run may be an older asyncroll's
    regenerated = {"at": _iso(time.time()), "asyncroll": __version__, "code": code_version_once()}
    receipt["exports_regenerated"] = regenerated | exports
    try:
        write_json_atomic(path, receipt)
    except OSError as exc:
        return f"{path} could not be rewritten ({exc.strerror or exc}); left as it was"
    return None


def _iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="milliseconds")


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"asyncroll": __version__, "python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_model() -> str:
    """The CPU's model name as Linux reports it ("unknown CPU" where /proc/cpuinfo does not say)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


#: Environment variables that change what a run does or measures, recorded in run.json's ``environment``
#: where set: the thread pools of a worker's libraries (BLAS, OpenMP), str hashing, time zone and locale
#: (file-name encoding), the GPUs visible, the proxies the HTTP client goes through (their passwords
#: masked) and the certificates it trusts. Others are not recorded (they may hold secrets).
BEHAVIOUR_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "PYTHONHASHSEED",
    "PYTHONUTF8",
    "PYTHONOPTIMIZE",
    "PYTHONPATH",
    "TZ",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "CUDA_VISIBLE_DEVICES",
    *(f"{name}_proxy" for name in ("http", "https", "all", "no")),
    *(f"{name}_PROXY" for name in ("HTTP", "HTTPS", "ALL", "NO")),
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)


def environment() -> dict[str, str]:
    """The :data:`BEHAVIOUR_VARIABLES` set in this process's environment (a proxy's password masked)."""
    from asyncroll.url_checks import masked_url

    out = {}
    for name in BEHAVIOUR_VARIABLES:
        value = os.environ.get(name)
        if value is not None:
            proxy = name.lower().endswith("_proxy") and name.lower() != "no_proxy"
            out[name] = masked_url(value) if proxy else value
    return out


def host() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        # the CPUs this process may use (taskset, a container's cpuset, fewer under a cgroup CPU quota:
        # docker --cpus): what its workers share
        "usable_cpus": usable_cpus(),
        "cpu_quota": quota_cpus(),  # the quota's CPUs (docker --cpus=1.5: 1.5), null without one
        "memory_bytes": psutil.virtual_memory().total,
        "python_executable": sys.executable,
    }


def file_sha256(path: Path) -> str:
    """The SHA-256 of the file at ``path``, read a block at a time (a workload may be gigabytes)."""
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


class Receipt:
    """The one writer of ``run.json``."""

    def __init__(self, path: Path, body: dict[str, Any], wall: float) -> None:
        self.path = path  # where it is written: a run directory moved while it ran is followed
        self._data: dict[str, Any] = {
            "schema_version": RECEIPT_SCHEMA_VERSION,
            "status": "preparing",
            "created_at": _iso(wall),
            **body,
            "error": None,
        }
        try:
            write_json_atomic(self.path, self._data)
        except OSError as exc:
            raise OutputWriteError(f"run.json: cannot write ({exc.strerror or exc})") from exc
        self._written = dict(self._data)

    @property
    def written_status(self) -> Status:
        """The status of the receipt last written whole."""
        status: Status = self._written["status"]
        return status

    @property
    def status(self) -> Status:
        status: Status = self._data["status"]
        return status

    def update(self, **fields: Any) -> None:
        """Rewrite run.json with ``fields``; raises :class:`~asyncroll.outputs.lines.OutputWriteError`
        when neither way below can write it (the receipt on disk is then the last one written, whole)."""
        self._data.update(fields)
        try:
            write_json_atomic(self.path, self._data)
        except OSError as exc:
            # A full disk has no room for a second copy; the old receipt's own bytes can hold the new one
            # (compact if need be): rewritten in place, a reader could meet it half-written (better than a
            # stale status). Never past the old size: a write that needs new blocks would be cut short.
            if not _rewrite_in_place(self.path, self._data):
                raise OutputWriteError(
                    f"run.json: cannot write ({exc.strerror or exc}); it still says "
                    f"{self._written['status']!r}"
                ) from exc
        self._written = dict(self._data)

    def transition(self, status: Status, wall: float, **fields: Any) -> None:
        self._data["status"] = status
        self._data[f"{status}_at"] = _iso(wall)
        self.update(**fields)
