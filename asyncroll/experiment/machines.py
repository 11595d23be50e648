"""What an experiment's comparison arms ran on and with: each arm's client machine and code (its run.json's
``host``, ``versions`` and ``code``) and GPU (its arm.json's ``gpu``), grouped so that a report says in one
line that every arm ran on one machine, or names the arms that did not; and the settings every arm shared
(the experiment config's model, workload, server kind and client settings).

``comparison.json`` records both (``machines``, ``settings``) as the experiment writes it, so that
``REPORT.md`` states its machine and settings without the run directories; one written before they were
recorded says so and points to each arm's run.json.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: run.json ``host`` fields that describe the machine (not its name, pid or the interpreter's path): text,
#: then numbers.
HOST_TEXT = ("cpu_model", "platform")
HOST_NUMBERS = ("cpu_count", "usable_cpus", "cpu_quota", "memory_bytes")
#: arm.json ``gpu`` fields that identify the GPU (not its memory in use or load at the check).
GPU_TEXT = ("name", "uuid", "driver")
GPU_NUMBERS = ("memory_total_mib",)
#: The experiment config's client settings left out of ``settings``: the per-arm deadline is not a setting
#: of the measurement.
SKIPPED_CLIENT = ("deadline_s",)


def _plain(record: Any, text: tuple[str, ...], numbers: tuple[str, ...] = ()) -> dict[str, str | int | float]:
    """The ``text`` fields of ``record`` that hold a string and the ``numbers`` that hold a number (a
    damaged or hand-edited file's other values are left out, as a missing one is)."""
    if not isinstance(record, dict):
        return {}
    out: dict[str, str | int | float] = {k: v for k in text if isinstance(v := record.get(k), str)}
    for key in numbers:
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value
    return out


def arm_machine(arm_dir: Path) -> dict[str, Any] | None:
    """An arm's client machine and code (``run/run.json``) and GPU (``arm.json``); None when neither file
    can be read (an arm that never started its client)."""
    from asyncroll.json_depth import read_json_object

    run = read_json_object(arm_dir / "run" / "run.json")
    receipt = read_json_object(arm_dir / "arm.json")
    if run is None and receipt is None:
        return None
    client = None
    if run is not None:
        client = _plain(run.get("host"), HOST_TEXT, HOST_NUMBERS) | _plain(run.get("versions"), ("python",))
        code = _plain(run.get("code"), ("describe", "package"))
        if version := code.get("describe") or code.get("package"):  # the checkout's describe, if any
            client["asyncroll"] = version
    gpu = receipt.get("gpu") if receipt is not None else None
    declared = isinstance(gpu, dict) and gpu.get("declared") is True
    return {"client": client, "gpu": _plain(gpu, GPU_TEXT, GPU_NUMBERS) if declared else None}


def machine_groups(machines: Mapping[str, dict[str, Any] | None], arm_ids: list[str]) -> list[dict[str, Any]]:
    """The arms ``arm_ids`` grouped by the machine each ran its client on, in the order of their first arm.
    An arm that left no run.json (not run yet, or its server never came up) ran no client: no number of
    the report's is its, and it is in no group (it would read as another machine)."""
    groups: list[dict[str, Any]] = []
    for arm_id in arm_ids:
        machine = machines.get(arm_id)
        if machine is None or not machine.get("client"):
            continue
        for group in groups:
            if group["client"] == machine["client"] and group["gpu"] == machine["gpu"]:
                group["arms"].append(arm_id)
                break
        else:
            groups.append({"client": machine["client"], "gpu": machine["gpu"], "arms": [arm_id]})
    return groups


def experiment_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The settings of the experiment config: model, workload (by its SHA-256: its path is the machine's),
    server kind, whether a GPU was declared, the client's settings every arm shares and each arm's own
    flags (``arm_args``)."""
    model, workload, server = (
        config.get("model") or {},
        config.get("workload") or {},
        config.get("server") or {},
    )
    client = {k: v for k, v in (config.get("client") or {}).items() if k not in SKIPPED_CLIENT}
    return {
        "model": {k: model.get(k) for k in ("served_name", "path", "revision")},
        "workload": {k: workload.get(k) for k in ("sha256", "description")},
        "server_kind": server.get("kind"),
        "gpu_declared": config.get("gpu") is not None,
        "client": client,
        "arm_args": {arm.get("name"): arm.get("extra_args") or [] for arm in config.get("arms") or []},
    }


def _section(settings: dict[str, Any], key: str) -> dict[str, Any]:
    value = settings.get(key)
    return value if isinstance(value, dict) else {}


def _value(value: Any) -> str:
    """A setting as JSON writes it (``true``, ``30.0``, ``["--flag"]``), a string as it is."""
    return value if isinstance(value, str) else json.dumps(value)


def _gib(value: Any) -> str | None:
    return f"{value / 2**30:.1f} GiB memory" if isinstance(value, (int, float)) and value > 0 else None


def describe_client(client: dict[str, Any] | None) -> str:
    """``AMD EPYC, 2 logical CPUs (2 usable), 23.5 GiB memory, Linux-…, Python 3.11.7, asyncroll 0310dc6``."""
    if not isinstance(client, dict) or not client:
        return "unknown (no run.json)"
    cpus = client.get("cpu_count")
    usable = client.get("usable_cpus")
    quota = client.get("cpu_quota")
    parts = [
        str(client["cpu_model"]) if client.get("cpu_model") else "CPU model unknown",
        (f"{cpus} logical CPUs" if cpus is not None else "CPUs unknown")
        + (f" ({usable} usable)" if usable is not None else "")
        + (f", a CPU quota of {quota}" if quota is not None else ""),
        _gib(client.get("memory_bytes")),
        str(client["platform"]) if client.get("platform") else None,
        f"Python {client['python']}" if client.get("python") else None,
        f"asyncroll {client['asyncroll']}" if client.get("asyncroll") else None,
    ]
    return ", ".join(p for p in parts if p)


def describe_gpu(gpu: dict[str, Any] | None) -> str:
    if not isinstance(gpu, dict):
        return "none declared"
    bits = [
        f"uuid {gpu['uuid']}" if gpu.get("uuid") else None,
        f"driver {gpu['driver']}" if gpu.get("driver") else None,
    ]
    details = ", ".join(b for b in bits if b)
    return f"{gpu.get('name') or 'declared, name unknown'}" + (f" ({details})" if details else "")


def machine_caption(machines: list[dict[str, Any]] | None) -> str:
    """The figure's one-line footer: the machine its numbers came from (REPORT.md says more)."""
    if machines is None:
        return "machine not recorded (each arm's run.json has it)"
    if len(machines) > 1:
        return f"the arms ran on {len(machines)} different machines, code or GPUs: REPORT.md names them"
    if not machines or not isinstance(machines[0].get("client"), dict):
        return "machine unknown (no arm left a run.json)"
    client, gpu = machines[0]["client"], machines[0].get("gpu")
    parts = [
        client.get("cpu_model"),
        f"{client['usable_cpus']} usable CPUs" if client.get("usable_cpus") is not None else None,
        f"Python {client['python']}" if client.get("python") else None,
        f"asyncroll {client['asyncroll']}" if client.get("asyncroll") else None,
    ]
    return f"client: {', '.join(str(p) for p in parts if p)}; GPU: {describe_gpu(gpu)}"


def machine_lines(machines: list[dict[str, Any]] | None, settings: dict[str, Any] | None) -> list[str]:
    """REPORT.md's "Machine and settings" section."""
    lines = ["## Machine and settings", ""]
    if machines is None or settings is None:
        return [
            *lines,
            "Not recorded in this comparison.json (written before it recorded them): each arm's run.json "
            "(`host`, `versions`, `code`) and arm.json (`gpu`) hold the machine, experiment.json (`config`) "
            "the settings.",
            "",
        ]
    if not machines:
        lines += ["Machine unknown: no comparison arm left a run.json (none ran its client).", ""]
    elif len(machines) == 1:
        group = machines[0]
        n = len(group.get("arms") or [])
        lines += [
            f"Every comparison arm that left a run.json ({n}) ran its client on one machine and code: "
            f"{describe_client(group.get('client'))}. GPU: {describe_gpu(group.get('gpu'))}.",
            "",
        ]
    else:
        lines += ["**The comparison arms did not all run on the same machine, code or GPU:**", ""]
        for group in machines:
            arms = ", ".join(str(a) for a in group.get("arms") or [])
            lines.append(
                f"- {arms}: {describe_client(group.get('client'))}; GPU: {describe_gpu(group.get('gpu'))}"
            )
        lines.append("")
    model, workload, client = (_section(settings, k) for k in ("model", "workload", "client"))
    shown = "; ".join(f"{k} {_value(v)}" for k, v in client.items() if v is not None and v != [])
    own = "; ".join(
        f"{name}: {' '.join(str(a) for a in args)}"
        for name, args in _section(settings, "arm_args").items()
        if isinstance(args, list) and args
    )
    lines += [
        f"Model `{model.get('served_name')}` ({model.get('path')}, revision {model.get('revision')}), "
        f"server kind {settings.get('server_kind')}; workload SHA-256 `{workload.get('sha256')}`"
        + (f" ({workload['description']})" if workload.get("description") else "")
        + f". Client settings of every arm: {shown or 'none recorded'}"
        + (f". An arm's own flags: {own}." if own else "."),
        "",
    ]
    return [" ".join(line.split()) if not line.startswith("#") else line for line in lines]  # one line each
