"""``asyncroll run``'s flags: settings refused before anything starts, deprecated aliases, warnings about
settings without effect, and the evaluator's limits. What is settled before a run starts is checked in
this process (``run_in_process``): an interpreter of its own would only repeat the imports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncroll.config import build_config
from asyncroll.errors import UsageError
from tests.cli_runs import SMOKE, run_in_process
from tests.conftest import invoke


def test_gpu_first_is_a_deprecated_alias_of_tool_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The alias changes only the settings (a warning; the receipt keeps the name given, the run and its
    summary use tool_first, whose real run is above): checked in this process."""
    result, seen = run_in_process(
        monkeypatch, "--workload", SMOKE, "--output", tmp_path / "run", "--policy", "gpu_first"
    )
    assert result.exit_code == 0, result.output
    assert "warning: --policy gpu_first is a deprecated alias of tool_first" in result.stderr
    assert seen[0].policy == "gpu_first" and seen[0].policy_name == "tool_first"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cpu-workers", "0"], "--cpu-workers: Input should be greater than or equal to 1"),
        (["--max-active-trajectories", "-1"], "--max-active-trajectories"),
        (["--backend", "vllm"], "--model is required with --backend vllm"),
        (["--max-retries", "1"], "--max-retries only applies to HTTP backends"),
        (["--warmup-requests", "3"], "--warmup-requests only applies to HTTP backends"),
        # the flag as typed: "--structured-output only applies" named a flag the user never gave
        (["--no-structured-output"], "error: --no-structured-output only applies to HTTP backends"),
        (["--no-replay", "--max-retries", "1"], "--no-replay, --max-retries only apply to HTTP backends"),
        # a scripted run reads no model and scrapes no server: the name did nothing, without a word
        (["--model", "m"], "--model only applies to HTTP backends, or with --metrics-url (its filter)"),
        (["--policy", "lifo"], "--policy: Input should be"),
        # another case or a hyphen: the list of twelve names alone left the user to spot it
        (["--policy", "FIFO"], "or 'asyncroll_repair' (did you mean 'fifo'?)"),
        (["--policy", "tool-first"], "(did you mean 'tool_first'?)"),
        (["--policy", "asyncrol"], "(did you mean 'asyncroll'?)"),
        (["--aging-weight", "inf"], "--aging-weight: Input should be a finite number"),
        (["--tool-timeout", "inf"], "--tool-timeout: Input should be a finite number"),
        (["--no-telemetry", "--metrics-url", "http://x/metrics"], "--no-telemetry conflicts"),
        # an interval for samples nobody takes was accepted without a word
        (["--no-telemetry", "--telemetry-interval", "2"], "conflicts with --telemetry-interval"),
        (["--metrics-url", "localhost:8000/metrics"], "must be an http:// or https:// URL"),
        (
            ["--backend", "openai", "--model", "sim", "--endpoint", "127.0.0.1:18101"],
            "--endpoint '127.0.0.1:18101': must be an http:// or https:// URL",
        ),
        (
            ["--backend", "vllm", "--model", "sim", "--endpoint", "localhost:18101"],
            "--endpoint 'localhost:18101': must be an http:// or https:// URL",
        ),
        (
            ["--backend", "vllm", "--model", "sim", "--endpoint", "http://"],
            "--endpoint 'http://': names no host",
        ),
        (  # httpx took it for port 80: a run against a server on 8000 sat paused on an open circuit
            ["--backend", "vllm", "--model", "sim", "--endpoint", "http://127.0.0.1:"],
            "--endpoint 'http://127.0.0.1:': has an empty port after its ':'",
        ),
        (
            ["--metrics-url", "http://[::1]:/metrics"],
            "--metrics-url 'http://[::1]:/metrics': has an empty port",
        ),
        (  # httpx put the query before the path: POST /?x=1/v1/chat/completions, the server's root
            ["--backend", "vllm", "--model", "sim", "--endpoint", "http://127.0.0.1:8000/?x=1"],
            "--endpoint 'http://127.0.0.1:8000/?x=1': give the server's root URL, without /v1, a query or a "
            "fragment",
        ),
        (  # a curl example's whole URL: POST /v1/chat/completions/v1/chat/completions, 404 at the warm-up
            [
                "--backend",
                "vllm",
                "--model",
                "sim",
                "--endpoint",
                "http://127.0.0.1:8000/v1/chat/completions",
            ],
            "--endpoint 'http://127.0.0.1:8000/v1/chat/completions': give the server's root URL, without /v1",
        ),
        (  # serve-sim --port 0 picks a free port: 0 itself, copied, got as far as the warm-up's ConnectError
            ["--backend", "vllm", "--model", "sim", "--endpoint", "http://127.0.0.1:0"],
            "--endpoint 'http://127.0.0.1:0': has port 0, where no server listens (serve-sim --port 0 prints "
            "the port it chose)",
        ),
        (  # httpx sent the chat requests to the root, but /metrics went to http://h:8000#x/metrics (a 404)
            ["--backend", "vllm", "--model", "sim", "--endpoint", "http://127.0.0.1:8000#x"],
            "--endpoint 'http://127.0.0.1:8000#x': give the server's root URL, without /v1, a query or a "
            "fragment",
        ),
        (  # click kept the last one silently: a user expecting routing across servers got one server
            ["--backend", "vllm", "--model", "sim", "--endpoint", "http://a:1", "--endpoint", "http://b:2"],
            "--endpoint given 2 times: a run sends every request to one server",
        ),
    ],
)
def test_invalid_settings_are_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    out = tmp_path / "run"
    result, seen = run_in_process(monkeypatch, "--workload", SMOKE, "--output", out, *args)
    assert result.exit_code == 2 and not seen, result.stdout
    assert message in result.stderr
    assert not out.exists()


def test_evaluator_limits_are_run_flags_bound_to_every_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--test-timeout``, ``--evaluation-timeout`` and ``--test-memory-mb`` (flags or a config file)
    become ``lcb_evaluate``'s own arguments; by default the evaluator's defaults, and no total budget
    (LiveCodeBench's scaled one, capped below --tool-timeout)."""
    import inspect

    from asyncroll.evaluator.evaluate import lcb_evaluate
    from asyncroll.runtime.collaborators import evaluator_options

    out = tmp_path / "run"
    given = ("--test-timeout", "2.5", "--evaluation-timeout", "40", "--test-memory-mb", "1024")
    result, seen = run_in_process(monkeypatch, "--workload", SMOKE, "--output", out, *given)
    assert result.exit_code == 0, result.output
    options = evaluator_options(seen[0])
    assert options == {
        "tool_timeout_s": 60.0,
        "time_limit_s": 2.5,
        "total_time_limit_s": 40.0,
        "memory_limit_mb": 1024,
    }
    inspect.signature(lcb_evaluate).bind("code", [], **options)  # the evaluator's own names
    config = tmp_path / "run.toml"
    config.write_text("test-timeout = 3\ntest_memory_mb = 512\ntool-timeout = 4\n")
    result, seen = run_in_process(monkeypatch, "--config", config, "--workload", SMOKE, "--output", out)
    assert result.exit_code == 0, result.output
    assert evaluator_options(seen[0]) == {"tool_timeout_s": 4.0, "time_limit_s": 3.0, "memory_limit_mb": 512}
    # The default per-test limit is not refused under a short --tool-timeout: the capped budget cuts it,
    # as before, and the verdict says so.
    result, seen = run_in_process(monkeypatch, "--workload", SMOKE, "--output", out, "--tool-timeout", "3")
    assert result.exit_code == 0, result.output
    assert evaluator_options(seen[0]) == {"tool_timeout_s": 3.0, "time_limit_s": 6.0, "memory_limit_mb": 768}
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--test-timeout", "0"], "--test-timeout: Input should be greater than 0"),
        (["--test-timeout", "nan"], "--test-timeout: Input should be a finite number"),
        (["--evaluation-timeout", "inf"], "--evaluation-timeout: Input should be a finite number"),
        (["--evaluation-timeout", "-1"], "--evaluation-timeout: Input should be greater than 0"),
        (["--test-memory-mb", "32"], "--test-memory-mb: Input should be greater than or equal to 64"),
        (["--test-memory-mb", "2097152"], "--test-memory-mb: Input should be less than or equal to 1048576"),
        (["--test-timeout", "55"], "--test-timeout 55 does not fit under --tool-timeout 60"),
        (
            ["--tool-timeout", "10", "--evaluation-timeout", "9.5"],
            "--evaluation-timeout 9.5 does not fit under --tool-timeout 10: an evaluation must end within 9s",
        ),
        (
            ["--test-timeout", "8", "--evaluation-timeout", "5"],
            "--test-timeout 8 is longer than --evaluation-timeout 5",
        ),
        # just past the cap: shown in full, not rounded to the cap it was compared with ("54 ... within 54s")
        (["--test-timeout", "54.0000001"], "--test-timeout 54.0000001 does not fit under --tool-timeout 60"),
        (
            ["--test-timeout", "7.0000001", "--evaluation-timeout", "7"],
            "--test-timeout 7.0000001 is longer than --evaluation-timeout 7,",
        ),
    ],
)
def test_evaluator_limits_that_cannot_hold_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    out = tmp_path / "run"
    result, seen = run_in_process(monkeypatch, "--workload", SMOKE, "--output", out, *args)
    assert result.exit_code == 2 and not seen and not out.exists(), result.output
    assert message in result.stderr


def test_sync_says_an_active_limit_has_no_effect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ("--workload", SMOKE, "--policy", "sync")
    given, _ = run_in_process(
        monkeypatch, *args, "--output", tmp_path / "a", "--max-active-trajectories", "8"
    )
    plain, _ = run_in_process(monkeypatch, *args, "--output", tmp_path / "b")
    assert "--max-active-trajectories 8 has no effect" in given.stderr
    assert "no effect" not in plain.stderr


@pytest.mark.timeout(60)
def test_evaluator_settings_for_a_workload_without_code_say_they_do_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--test-timeout`` and the other evaluator settings were accepted without a word for a workload that
    evaluates no code: a user tuning them saw nothing change."""
    from asyncroll.commands.common import warn_no_evaluations

    # in this process, as the warnings below (tests/test_run_end_to_end.py runs the command in its own)
    result = invoke("run", "--workload", SMOKE, "--output", tmp_path / "run", "--test-timeout", "2")
    assert result.exit_code == 0, result.stderr
    want = "warning: --test-timeout has no effect: no problem of the workload evaluates code (lcb_evaluate)"
    assert want in result.stderr
    warn_no_evaluations({"test_timeout", "test_memory_mb", "policy"}, {"lcb_evaluate", "add"})
    warn_no_evaluations({"policy"}, {"add"})
    assert capsys.readouterr().err == ""
    warn_no_evaluations({"allow_weak_isolation", "evaluation_timeout"}, set())
    assert "--evaluation-timeout, --allow-weak-isolation have no effect" in capsys.readouterr().err


def test_a_telemetry_interval_without_a_source_says_it_does_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--telemetry-interval`` with no telemetry source to sample (the scripted backend, no --metrics-url
    or --nvml-device; an openai server of undeclared kind) was accepted without a word, as the evaluator's
    and the pressure policy's settings no longer are; with a source it is read and nothing is said."""
    args = ("--workload", SMOKE, "--telemetry-interval", "1")
    alone, _ = run_in_process(monkeypatch, *args, "--output", tmp_path / "a")
    assert alone.exit_code == 0, alone.output
    assert "warning: --telemetry-interval has no effect: no telemetry source is sampled" in alone.stderr
    openai = ("--backend", "openai", "--model", "m")
    probed, _ = run_in_process(monkeypatch, *args, *openai, "--output", tmp_path / "b")
    assert "--telemetry-interval has no effect" in probed.stderr
    for source in (["--metrics-url", "http://127.0.0.1:9/metrics"], ["--nvml-device", "0"]):
        read, _ = run_in_process(monkeypatch, *args, *source, "--output", tmp_path / source[0][2:])
        assert read.exit_code == 0 and "no effect" not in read.stderr, read.output
    vllm_args = ("--backend", "vllm", "--model", "m", "--output", tmp_path / "v")
    vllm, _ = run_in_process(monkeypatch, *args, *vllm_args)
    assert vllm.exit_code == 0 and "no effect" not in vllm.stderr, vllm.output
    plain, _ = run_in_process(monkeypatch, "--workload", SMOKE, "--output", tmp_path / "p")
    assert "no effect" not in plain.stderr


@pytest.mark.parametrize("switch", ["--structured-output", "--no-structured-output"])
def test_structured_output_with_replay_says_it_does_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, switch: str
) -> None:
    """A replay sends no response_format (its actions are the script's; run.json's backend section says
    ``structured_output: false``): either switch given with ``--replay`` was accepted without a word."""
    http = ("--workload", SMOKE, "--backend", "vllm", "--model", "m")
    result, seen = run_in_process(monkeypatch, *http, "--output", tmp_path / "a", "--replay", switch)
    assert result.exit_code == 0 and seen, result.output
    assert f"warning: {switch} has no effect with --replay" in result.stderr
    agent, _ = run_in_process(monkeypatch, *http, "--output", tmp_path / "b", switch)
    plain, _ = run_in_process(monkeypatch, *http, "--output", tmp_path / "c", "--replay")
    assert "no effect" not in agent.stderr + plain.stderr, agent.output + plain.output


@pytest.mark.parametrize(
    ("given", "off", "want"),
    [
        (
            ("--retry-max-delay", "3"),
            ("--max-retries", "0"),
            "--retry-max-delay has no effect with --max-retries 0",
        ),
        (
            ("--server-down-timeout", "5"),
            ("--circuit-failures", "0"),
            "--server-down-timeout has no effect with --circuit-failures 0",
        ),
    ],
)
def test_a_retry_or_circuit_setting_with_its_mechanism_off_says_it_does_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: tuple[str, str], off: tuple[str, str], want: str
) -> None:
    """``--retry-max-delay`` caps the delay of a retry and ``--server-down-timeout`` bounds an open circuit:
    with no retries (``--max-retries 0``, the default) or no circuit (``--circuit-failures 0``) neither is
    ever read, and both were accepted without a word, the run recording a setting that did nothing."""
    http = ("--workload", SMOKE, "--backend", "openai", "--model", "m")
    for name, args in (("off", off), ("default", ())):
        if name == "default" and off[0] == "--circuit-failures":
            continue  # the circuit is on by default (5)
        result, seen = run_in_process(monkeypatch, *http, *given, *args, "--output", tmp_path / name)
        assert result.exit_code == 0 and seen, result.output
        assert f"warning: {want}" in result.stderr
    on = ("--max-retries", "2") if off[0] == "--max-retries" else ("--circuit-failures", "3")
    used, _ = run_in_process(monkeypatch, *http, *given, *on, "--output", tmp_path / "on")
    assert used.exit_code == 0 and "no effect" not in used.stderr, used.output


def test_an_inflight_limit_above_the_active_one_is_said_by_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As ``simulate`` says it: at most one model request per active trajectory is ever in flight."""
    args = ("--workload", SMOKE, "--max-active-trajectories", "2", "--max-inflight-model-requests", "8")
    result, seen = run_in_process(monkeypatch, *args, "--output", tmp_path / "a")
    assert result.exit_code == 0 and seen, result.output
    assert "warning: --max-inflight-model-requests 8 has no effect above --max-active-trajectories 2" in (
        result.stderr
    )


@pytest.mark.timeout(60)
def test_a_limit_past_the_workload_is_said(tmp_path: Path) -> None:
    """``--limit 100`` on a 3-problem workload ran 3 without a word, where the converters say it."""
    result = invoke("run", "--workload", SMOKE, "--output", tmp_path / "run", "--limit", "100")
    assert result.exit_code == 0, result.stderr
    assert "note: --limit 100 asked for more problems than the workload holds: 3 run" in result.stderr


def test_evaluator_settings_given_as_an_iterator_are_all_named(capsys: pytest.CaptureFixture[str]) -> None:
    """``given`` is any iterable: a generator was spent by the first setting's test, the others unnamed."""
    from asyncroll.commands.common import warn_no_evaluations

    warn_no_evaluations(iter(["test_timeout", "test_memory_mb"]), iter(["add"]))
    assert "--test-timeout, --test-memory-mb have no effect" in capsys.readouterr().err


def test_gpu_slots_is_a_deprecated_alias(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The alias only sets --max-inflight-model-requests, which the receipt and summary then report as
    any setting (the real runs above): checked in this process."""
    args = ("--workload", SMOKE, "--gpu-slots", "3")
    with pytest.warns(DeprecationWarning, match="--gpu-slots is deprecated"):
        result, seen = run_in_process(monkeypatch, *args, "--output", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "--gpu-slots is deprecated" in result.stderr
    assert seen[0].max_inflight_model_requests == 3 and seen[0].limits.max_inflight_model_requests == 3
    with pytest.warns(DeprecationWarning):
        both, seen = run_in_process(
            monkeypatch, *args, "--output", tmp_path / "r2", "--max-inflight-model-requests", "2"
        )
    assert both.exit_code == 2 and not seen and not (tmp_path / "r2").exists()
    # a refused value is named by the flag the user typed (it said --max-inflight-model-requests)
    with pytest.warns(DeprecationWarning):
        zero, seen = run_in_process(
            monkeypatch, "--workload", SMOKE, "--gpu-slots", "0", "--output", tmp_path / "z"
        )
    assert zero.exit_code == 2 and not seen
    assert "--gpu-slots: " in zero.stderr and "--max-inflight-model-requests:" not in zero.stderr, zero.stderr


@pytest.mark.timeout(30)
def test_more_worker_processes_than_the_cap_are_refused(tmp_path: Path) -> None:
    result = invoke("run", "--workload", SMOKE, "--output", tmp_path / "run", "--cpu-workers", "5000")
    assert result.exit_code == 2 and "at most 1024 worker processes" in result.stderr
    assert not (tmp_path / "run").exists()


def test_pressure_settings_with_a_baseline_policy_warn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "c.json").write_text(json.dumps({"aging_seconds": 5}))
    result, seen = run_in_process(
        monkeypatch,
        "--workload",
        SMOKE,
        "--output",
        tmp_path / "r",
        "--policy",
        "tool_first",
        "--config",
        tmp_path / "c.json",
    )
    assert result.exit_code == 0 and len(seen) == 1, result.output
    assert "warning: --aging-seconds has no effect with --policy tool_first" in result.stderr


@pytest.mark.parametrize("flag", ["endpoint", "metrics_url"])
def test_credentials_in_a_url_are_refused_and_not_echoed(flag: str) -> None:
    """``http://user:password@host`` was accepted and the password stored verbatim in run.json (its
    command and config). It is refused before anything starts; the message masks the password and
    names the way to send a key that records only a variable's name."""
    url = "http://alice:s3cret@127.0.0.1:8000" + ("/metrics" if flag == "metrics_url" else "")
    settings = {"workload": "w", "output": "o", "backend": "openai", "model": "m", flag: url}
    with pytest.raises(UsageError) as caught:
        build_config(settings)
    message = str(caught.value)
    assert "alice:***@127.0.0.1:8000" in message and "s3cret" not in message
    advice = "--api-key-env" if flag == "endpoint" else "the /metrics scrape sends no key"
    assert "carries credentials" in message and advice in message
    if flag == "endpoint":  # its other checks (an SDK base_url, a query) printed the password
        for suffix in ("/v1", "/?q=1"):
            settings[flag] = url + suffix
            with pytest.raises(UsageError) as caught:
                build_config(settings)
            assert "s3cret" not in str(caught.value) and "alice:***@" in str(caught.value)
    settings[flag] = "http://bob@[::1]:8000"  # a user name alone may be a token: masked whole
    with pytest.raises(UsageError, match=r"'http://\*\*\*@\[::1\]:8000': carries credentials"):
        build_config(settings)
    for bad in ("http://alice:s3#cret@127.0.0.1:8000", "http://alice:s3/cret@127.0.0.1:8000"):
        settings[flag] = bad  # urlsplit's 'Port could not be cast to integer value as 's3'' was quoted
        with pytest.raises(UsageError) as caught:
            build_config(settings)
        assert "alice:***@127.0.0.1:8000" in str(caught.value) and "s3" not in str(caught.value)
        assert "carries credentials" in str(caught.value)


@pytest.mark.parametrize("flag", ["endpoint", "metrics_url"])
def test_a_credential_in_a_urls_query_is_refused_and_not_echoed(flag: str) -> None:
    """``--metrics-url 'http://gpu:9400/metrics?token=SECRET'`` (a gateway's scrape token) was accepted
    and the token kept verbatim in run.json's command and config, as a password in ``user:password@``
    was before it was refused; ``--endpoint`` refused its query, quoting the token. Both are refused now
    with the value masked; a query of other parameters (a metrics filter) is accepted as before."""
    url = "http://127.0.0.1:8000" + ("/metrics" if flag == "metrics_url" else "")
    settings = {"workload": "w", "output": "o", "backend": "vllm", "model": "m", flag: ""}
    queries = ("?token=s3cret", "?n=vllm&api_key=s3cret", "?X-Amz-Signature=s3cret", "?access-token=s3cret")
    for query in queries:
        settings[flag] = url + query
        with pytest.raises(UsageError) as caught:
            build_config(settings)
        message = str(caught.value)
        assert "s3cret" not in message and "=***" in message, message
        advice = "--api-key-env" if flag == "endpoint" else "the /metrics scrape sends no key"
        assert "carries a credential in its query" in message and advice in message
    if flag == "metrics_url":
        settings[flag] = url + "?name[]=vllm:num_requests_running&monkey=1"
        assert build_config(settings).metrics_url == settings[flag]


@pytest.mark.parametrize(
    "query",
    [
        "?accessToken=s3cret",
        "?n=vllm&authToken=s3cret",
        "?sessionToken=s3cret",
        "?code=s3cret",
        "?n=vllm&jwt=s3cret",
    ],
)
def test_a_camel_case_credential_in_a_urls_query_is_refused(query: str) -> None:
    """``?accessToken=`` (a camelCase name, as many gateways and SDKs spell it) named a credential as
    ``?access_token=`` does, but only ``_`` and ``-`` were read as word breaks: it was accepted and its
    token kept verbatim in run.json's command and config; so were an Azure Functions URL's key
    (``?code=``) and a ``?jwt=``. A name that is no credential (``?keyName=``, ``?monkeyBusiness=``,
    ``?codec=``) is still accepted."""
    url = "http://127.0.0.1:8000/metrics"
    settings = {"workload": "w", "output": "o", "backend": "vllm", "model": "m", "metrics_url": url + query}
    with pytest.raises(UsageError) as caught:
        build_config(settings)
    assert "s3cret" not in str(caught.value) and "carries a credential in its query" in str(caught.value)
    settings["metrics_url"] = url + "?keyName=a&monkeyBusiness=b&codec=c&name[]=vllm:num_requests_running"
    assert build_config(settings).metrics_url == settings["metrics_url"]


@pytest.mark.parametrize("credential", ["http://alice:s3cret@127.0.0.1:8000/metrics", "?token=s3cret"])
def test_a_metrics_url_refused_for_its_credential_gives_no_api_key_advice(credential: str) -> None:
    """``--metrics-url`` with a token was refused with the advice to give the key by ``--api-key-env``,
    'sent as Authorization: Bearer': telemetry's scrape sends no key (docs/SERVERS.md), so that advice led
    to a
    scrape refused 401 with every metric missing. It now says so; ``--endpoint``'s advice is unchanged."""
    url = credential if credential.startswith("http") else "http://127.0.0.1:8000/metrics" + credential
    settings = {"workload": "w", "output": "o", "backend": "vllm", "model": "m", "metrics_url": url}
    with pytest.raises(UsageError) as caught:
        build_config(settings)
    message = str(caught.value)
    assert "s3cret" not in message and "--api-key-env" not in message, message
    assert "the /metrics scrape sends no key" in message, message


def test_a_query_credential_is_found_and_masked_after_a_semicolon_and_as_sig() -> None:
    """A query's parameters split at ';' as at '&', and ``sig`` (a SAS signature) is a credential."""
    from asyncroll.url_checks import http_url_problem, masked_url

    for url in ("http://h:8000/?a=1;token=x", "http://h:8000/?sv=1&sig=abc"):
        assert "carries a credential in its query" in (http_url_problem(url) or ""), url
    assert masked_url("http://h:8000/?a=1;token=x") == "http://h:8000/?a=1;token=***"
    assert masked_url("http://h:8000/?sv=1&sig=abc") == "http://h:8000/?sv=1&sig=***"
