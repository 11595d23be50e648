"""scripts/serving_ablation.py, the model-only measurement: against a real serve-sim on loopback, and odd
replies counted without failing the pass."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.children import end
from tests.experiments import CLI, ROOT, read


def load_ablation() -> Any:
    """scripts/serving_ablation.py as a module (scripts/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("serving_ablation", ROOT / "scripts/serving_ablation.py")
    assert spec is not None and spec.loader is not None
    ablation = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ablation)
    return ablation


def never_measure(ablation: Any, monkeypatch: pytest.MonkeyPatch, before: str) -> list[bool]:
    """Make ``ablation``'s measurement fail the test if it starts (``before``: what must come first); the
    list returned records whether it was called."""
    measured: list[bool] = []

    async def measure(args: Any) -> dict[str, Any]:
        measured.append(True)
        raise AssertionError(f"measured before {before}")

    monkeypatch.setattr(ablation, "measure", measure)
    return measured


@pytest.mark.timeout(150)
def test_serving_ablation_against_serve_sim(tmp_path: Path) -> None:
    """The model-only measurement against a real loopback server: counts, tokens and percentiles agree."""
    log = (tmp_path / "sim.log").open("wb")
    server = subprocess.Popen(
        [*CLI, "serve-sim", "--port", "0", "--model", "sim", "--step-base-ms", "1", "--step-per-seq-ms", "0"],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    try:
        # while it runs, however long its start takes on a loaded machine (the hard timeout bounds it)
        while not (text := (tmp_path / "sim.log").read_text()).startswith("serve-sim listening on "):
            assert server.poll() is None, text
            time.sleep(0.02)
        url = text.split()[3]
        done = subprocess.run(
            [
                sys.executable,
                "scripts/serving_ablation.py",
                "--endpoint",
                url,
                "--model",
                "sim",
                "--workload",
                "examples/toolmath/workload.jsonl",
                "--concurrency",
                "3",
                "--requests",
                "10",
                "--max-tokens",
                "8",
                "--fixed-length",
                "--repeats",
                "2",
                "--warmup",
                "1",
                "--output",
                str(tmp_path / "r.json"),
            ],
            capture_output=True,
            text=True,
            timeout=45,
            cwd=ROOT,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        result = read(tmp_path / "r.json")
        assert len(result["repeats"]) == 2
        for rep in result["repeats"]:
            assert rep["ok"] == 10 and rep["errors"] == {} and rep["output_tokens"] == 80
            lat = rep["latency_s"]
            assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
            assert rep["requests_per_s"] == pytest.approx(10 / rep["wall_s"])
        assert "| requests_per_s |" in done.stdout
        # The machine and the client's versions go next to the numbers, printed and in the JSON.
        assert done.stdout.startswith("machine: ") and "logical CPUs" in done.stdout.splitlines()[0]
        assert {"cpu", "logical_cpus", "python", "platform"} <= set(result["machine"])
        assert set(result["versions"]) == {"asyncroll", "httpx"} and result["versions"]["httpx"]
    finally:
        try:
            with contextlib.suppress(ProcessLookupError):  # the group is gone already
                os.killpg(server.pid, signal.SIGTERM)
            server.wait(10)
        finally:
            end(server)


@pytest.mark.timeout(30)
def test_serving_ablation_counts_odd_replies_without_failing_the_pass() -> None:
    """A 200 whose body is not a completion (not JSON; JSON without an object; ``usage`` not an object)
    is one ``bad_response``, not an exception that ends the pass; good replies are still measured."""
    import argparse
    import asyncio
    from http.server import BaseHTTPRequestHandler

    import httpx

    from tests.loopback import LoopbackServer

    ablation = load_ablation()
    bodies = [b"<html>busy</html>", b"[1, 2]", b'{"usage": 7}', b'{"usage": {"completion_tokens": 5}}']

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            data = bodies[current[0]]
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            return None

    args = argparse.Namespace(
        model="m", max_tokens=4, seed=0, fixed_length=False, concurrency=2, request_timeout=5.0
    )
    current = [0]
    results = []
    with LoopbackServer(Handler) as server:

        async def one() -> dict[str, Any]:
            async with httpx.AsyncClient(base_url=server.url, trust_env=False) as client:
                return await ablation.one_pass(args, ["p", "q"], client)

        for index in range(len(bodies)):
            current[0] = index
            results.append(asyncio.run(one()))
    assert [r["errors"] for r in results[:3]] == [{"bad_response": 2}] * 3
    assert all(r["ok"] == 0 for r in results[:3])
    assert results[3]["errors"] == {} and results[3]["ok"] == 2 and results[3]["output_tokens"] == 10


@pytest.mark.timeout(30)
@pytest.mark.parametrize("where", ["existing", "no_parent", "a_directory"])
def test_serving_ablation_refuses_an_output_it_cannot_write_before_measuring(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # --output was written only after every repeat (minutes of GPU time), with write_text: an existing
    # file was overwritten, and a missing folder or a directory lost the whole measurement to a traceback.
    ablation = load_ablation()
    measured = never_measure(ablation, monkeypatch, "the output was checked")
    output = {
        "existing": tmp_path / "r.json",
        "no_parent": tmp_path / "no" / "r.json",
        "a_directory": tmp_path,
    }[where]
    if where == "existing":
        output.write_text("an earlier result\n")
    (tmp_path / "w.jsonl").write_text('{"prompt": "p"}\n')
    with pytest.raises(SystemExit) as exited:
        ablation.main(
            [
                "--endpoint",
                "http://127.0.0.1:9",
                "--model",
                "m",
                "--workload",
                str(tmp_path / "w.jsonl"),
                "--output",
                str(output),
            ]
        )
    assert exited.value.code == 2 and not measured
    assert f"--output {output}" in capsys.readouterr().err
    if where == "existing":
        assert output.read_text() == "an earlier result\n"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("where", ["missing", "a_directory", "not_utf8"])
def test_serving_ablation_refuses_a_workload_it_cannot_read_before_measuring(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A missing --workload was a FileNotFoundError traceback (a directory: IsADirectoryError, bytes that
    # are not UTF-8: UnicodeDecodeError) out of the measurement, exit 1, not a usage error.
    ablation = load_ablation()
    never_measure(ablation, monkeypatch, "the workload was read")
    workload = {"missing": tmp_path / "w.jsonl", "a_directory": tmp_path, "not_utf8": tmp_path / "w.jsonl"}
    if where == "not_utf8":
        workload[where].write_bytes(b'{"prompt": "caf\xe9"}\n')
    args = ["--endpoint", "http://127.0.0.1:9", "--model", "m", "--workload", str(workload[where])]
    with pytest.raises(SystemExit) as exited:
        ablation.main(args)
    said = "not UTF-8 text (invalid continuation byte at byte 15)" if where == "not_utf8" else "cannot read"
    assert exited.value.code == 2 and f"--workload {workload[where]}: {said}" in capsys.readouterr().err


@pytest.mark.timeout(30)
def test_serving_ablation_names_where_a_workload_is_not_utf8(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # read as text, its place was the byte's in the decoder's 8 KiB chunk (7,823 for 16,015), with no line
    ablation = load_ablation()
    never_measure(ablation, monkeypatch, "the workload was read")
    workload = tmp_path / "w.jsonl"
    workload.write_bytes(b'{"prompt": "p"}\n' * 1000 + b'{"prompt": "caf\xe9"}\n')
    args = ["--endpoint", "http://127.0.0.1:9", "--model", "m", "--workload", str(workload)]
    with pytest.raises(SystemExit) as exited:
        ablation.main(args)
    said = capsys.readouterr().err
    assert exited.value.code == 2
    assert f"{workload}: not UTF-8 text (invalid continuation byte at byte 16015, line 1001)" in said


@pytest.mark.timeout(30)
@pytest.mark.parametrize("timeout", ["0", "-1", "nan"])
def test_serving_ablation_refuses_a_request_timeout_that_is_not_positive(
    timeout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # 0 or -1 timed out every request and reported 0 requests/s; nan was a ValueError traceback group.
    ablation = load_ablation()
    args = ["--endpoint", "http://127.0.0.1:9", "--model", "m", "--workload", "w.jsonl"]
    with pytest.raises(SystemExit) as exited:
        ablation.main([*args, f"--request-timeout={timeout}"])
    assert exited.value.code == 2
    assert "--request-timeout must be a finite number > 0" in capsys.readouterr().err


def test_the_machine_says_the_cpus_the_client_could_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client run under ``taskset -c 0`` or ``docker --cpus=1`` (beside the server, on its cores) said
    only the host's logical CPUs: its figures read as those of a client with every CPU of the machine."""
    from asyncroll import cpus

    ablation = load_ablation()
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 1)
    assert ablation.machine()["usable_cpus"] == 1
    assert ablation.machine()["logical_cpus"] == os.cpu_count()


@pytest.mark.timeout(30)
def test_serving_ablation_records_every_setting_that_shapes_the_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The JSON named the workload by its path only and left out the seed, the warm-up and the request
    timeout (and the temperature sent): a result file could not say which prompts it measured nor how to
    repeat it, though SERVING_ABLATION.md asks for the same requests on every stack."""
    import asyncio
    import hashlib

    ablation = load_ablation()
    passes: list[int] = []

    async def one_pass(args: Any, prompts: list[str], client: Any) -> dict[str, Any]:
        passes.append(len(prompts))
        lat = {"p50": 1.0, "p90": 1.0, "p99": 1.0, "min": 1.0, "max": 1.0}
        return {"requests_per_s": 1.0, "output_tokens_per_s": 8.0, "latency_s": lat}

    monkeypatch.setattr(ablation, "one_pass", one_pass)
    workload = ROOT / "examples/toolmath/workload.jsonl"
    args = _measure_args(workload, concurrency=2, requests=3, repeats=2, warmup=1, seed=7)
    result = asyncio.run(ablation.measure(args))
    assert passes == [1, 3, 3]  # the warm-up, then two repeats
    assert result["workload_sha256"] == hashlib.sha256(workload.read_bytes()).hexdigest()
    assert (result["temperature"], result["seed"], result["warmup"], result["request_timeout_s"]) == (
        0,
        7,
        1,
        30.0,
    )


def test_serving_ablation_hashes_the_workload_it_read_not_the_file_after_measuring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workload's SHA-256 was read from the file after every pass: a workload rewritten meanwhile gave
    the hash of prompts not sent, and one removed (a temporary file, a cleaned directory) lost the whole
    measurement to a FileNotFoundError."""
    import asyncio
    import hashlib

    ablation = load_ablation()
    workload = tmp_path / "workload.jsonl"
    workload.write_text('{"prompt": "one"}\n', encoding="utf-8")
    sent = hashlib.sha256(workload.read_bytes()).hexdigest()

    async def one_pass(args: Any, prompts: list[str], client: Any) -> dict[str, Any]:
        workload.unlink(missing_ok=True)  # gone while it measured
        lat = {"p50": 1.0, "p90": 1.0, "p99": 1.0, "min": 1.0, "max": 1.0}
        return {"requests_per_s": 1.0, "output_tokens_per_s": 8.0, "latency_s": lat}

    monkeypatch.setattr(ablation, "one_pass", one_pass)
    args = _measure_args(workload, concurrency=1, requests=1, repeats=1, warmup=0, seed=0)
    assert asyncio.run(ablation.measure(args))["workload_sha256"] == sent


def _measure_args(workload: Path, **given: Any) -> Any:
    """The script's arguments for ``measure`` against an address nothing answers (``one_pass`` is patched)."""
    import argparse

    defaults = {"endpoint": "http://127.0.0.1:9", "model": "sim", "max_tokens": 8, "fixed_length": False}
    return argparse.Namespace(workload=workload, request_timeout=30.0, **defaults, **given)
