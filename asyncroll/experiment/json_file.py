"""Reading one JSON file an experiment command is given (its config, a comparison.json), refusing with the
file's name what the ``json`` module would read wrongly or at any cost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asyncroll.config import MAX_CONFIG_BYTES
from asyncroll.errors import UsageError
from asyncroll.json_checks import json_error_text, not_utf8, unique_keys, utf8_text
from asyncroll.json_depth import TOO_DEEP, json_loads


def read_json_file(path: Path, limit: int = MAX_CONFIG_BYTES) -> Any:
    """The JSON value in ``path``, or a UsageError that names the file: larger than ``limit`` bytes,
    unreadable, not UTF-8, not JSON, a key given twice in one object (``json`` would keep the last
    silently), an integer past Python's 4,300-digit limit, or nesting past its recursion limit."""
    try:
        with path.open("rb") as file:  # not read_text: /dev/zero or a mistaken model file filled memory
            raw = file.read(limit + 1)
        if len(raw) > limit:
            raise UsageError(f"{path}: larger than {limit >> 20} MiB: not a file this command reads")
        text = utf8_text(raw)  # a byte order mark (Notepad's) as a workload's
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: {not_utf8(exc)}") from None
    try:
        return json_loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as exc:
        # its place after the message, as --config says it: "Unterminated string starting at" ended there
        raise UsageError(f"{path}: invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except ValueError as exc:  # a repeated key, an integer past Python's digit limit
        message = json_error_text(exc)
        raise UsageError(f"{path}: invalid JSON: {message}") from None
    except RecursionError:
        raise UsageError(f"{path}: invalid JSON: {TOO_DEEP}") from None


def receipt_config(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """The config an experiment's ``experiment.json`` (at ``path``) records, to run that experiment again
    (its workload by the absolute path it resolved); any other JSON object as it is. Another of the
    experiment's records (an ``arm.json``, a ``comparison.json``), or an ``experiment.json`` without an
    object of settings, is refused by its kind: read as a config, each of its keys was an unknown setting."""
    from asyncroll.receipt_settings import is_receipt

    if "kind" not in data and is_receipt(data):  # a run's (an arm's client's, say): it has no kind
        raise UsageError(
            f"{path}: a run's run.json, not an experiment config (asyncroll run --config re-runs that run): "
            "give the experiment's config file, or its experiment.json (whose 'config' is read)"
        )
    kind = data.get("kind")
    if not (isinstance(kind, str) and kind.startswith("asyncroll.")):
        return data
    if kind == "asyncroll.experiment" and isinstance(data.get("config"), dict):
        return dict(data["config"])
    held = f"a record of kind {kind!r}"
    if kind == "asyncroll.experiment":
        held = "an experiment.json without its config"
    raise UsageError(
        f"{path}: {held}, not an experiment config: give the experiment's config file, or its "
        "experiment.json (whose 'config' is read)"
    )
