"""`asyncroll serve-sim`: the OpenAI-compatible inference-server simulator on loopback."""

from __future__ import annotations

import errno
import math
from typing import Annotated

import typer

from asyncroll.commands.common import Opt, fail

#: uvicorn's log levels (``uvicorn.config.LOG_LEVELS``, not imported: ``--help`` stays fast).
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def serve_sim(
    ctx: typer.Context,
    host: Annotated[str, Opt(help="Address to listen on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, Opt(help="Port; 0 picks a free one (printed on the first line).")] = 8000,
    model: Annotated[str, Opt(help="The served model name requests must use.")] = "sim",
    max_num_seqs: Annotated[int, Opt(help="Running-batch limit.")] = 256,
    step_base_ms: Annotated[float, Opt(help="Fixed step time, any batch (ms).")] = 12.0,
    step_per_seq_ms: Annotated[float, Opt(help="Added step time per running sequence (ms).")] = 0.08,
    prefill_ms_per_token: Annotated[float, Opt(help="Prefill cost per prompt token (ms).")] = 0.03,
    chars_per_token: Annotated[
        float, Opt(help="Characters per token for size estimates (at least 0.01).")
    ] = 4.0,
    kv_cache_tokens: Annotated[int, Opt(help="KV-cache capacity in tokens (for the usage gauge).")] = 262_144,
    max_model_len: Annotated[int, Opt(help="Context length (prompt + completion) in tokens.")] = 32_768,
    metrics_flavor: Annotated[
        str, Opt(help="vllm | sglang: /metrics names and /v1/models owned_by.")
    ] = "vllm",
    enforce_schema: Annotated[
        bool, Opt("--enforce-schema/--no-enforce-schema", help="Replies always match a json_schema.")
    ] = True,
    seed: Annotated[int, Opt(help="Seed of the reply policy and the fault draws.")] = 0,
    rate_429: Annotated[float, Opt("--rate-429", help="Fraction of requests answered 429.")] = 0.0,
    rate_500: Annotated[float, Opt("--rate-500", help="Fraction answered 500.")] = 0.0,
    rate_503: Annotated[float, Opt("--rate-503", help="Fraction answered 503.")] = 0.0,
    retry_after: Annotated[
        float, Opt(help="retry-after of a 429, s (negative: none; with --rate-429).")
    ] = 1.0,
    reset_rate: Annotated[float, Opt(help="Fraction whose connection is reset before a response.")] = 0.0,
    truncate_rate: Annotated[float, Opt(help="Fraction whose body is cut off mid-way.")] = 0.0,
    malformed_rate: Annotated[float, Opt(help="Fraction answered 200 with a body that is not JSON.")] = 0.0,
    invalid_action_rate: Annotated[
        float, Opt(help="With --no-enforce-schema: fraction answered with prose, not an action.")
    ] = 0.0,
    slow_rate: Annotated[float, Opt(help="Fraction delayed by --slow-s before the engine.")] = 0.0,
    slow_s: Annotated[float, Opt(help="Delay of a slow request, s (with --slow-rate).")] = 1.0,
    reject_schema: Annotated[
        bool,
        Opt(
            "--reject-schema",
            help="Refuse every json_schema request with 400 (as vLLM answers a schema it cannot compile).",
        ),
    ] = False,
    log_level: Annotated[str, Opt(help="uvicorn log level: " + " | ".join(LOG_LEVELS) + ".")] = "warning",
) -> None:
    """Serve an OpenAI-compatible inference-server simulator (batching engine in real time, faults, metrics).

    Endpoints: POST /v1/chat/completions (streamed with "stream": true, as vLLM streams), GET /health,
    GET /v1/models, GET /version, GET /metrics, GET /sim/stats, POST /sim/reset-stats.
    The first line printed is "serve-sim listening on http://HOST:PORT ...". Fault rates are drawn
    independently per request, in the order 429, 500, 503, reset, truncate, malformed, invalid action; the
    first drawn applies (--rate-429 0.6 --rate-500 0.6: about 60% 429 and 24% 500).
    """
    from asyncroll.backends.server_model import ServerModelConfig
    from asyncroll.errors import OutputWriteError
    from asyncroll.serve_sim.config import FaultConfig, SimConfig
    from asyncroll.serve_sim.server import serve_forever

    try:
        if not 0 <= port <= 65535:
            raise ValueError(f"--port must be in [0, 65535], got {port}")
        if log_level.lower() not in LOG_LEVELS:  # uvicorn raised a KeyError traceback for it at start-up
            raise ValueError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}")
        if not math.isfinite(retry_after):  # checked here: a negative value becomes "none" below
            raise ValueError(f"--retry-after must be a finite number, got {retry_after}")
        sim = SimConfig(
            model=model,
            engine=ServerModelConfig(max_num_seqs, step_base_ms, step_per_seq_ms, prefill_ms_per_token),
            chars_per_token=chars_per_token,
            kv_cache_tokens=kv_cache_tokens,
            max_model_len=max_model_len,
            metrics_flavor=metrics_flavor,  # type: ignore[arg-type]  # validated by SimConfig
            enforce_schema=enforce_schema,
            seed=seed,
            faults=FaultConfig(
                rate_429=rate_429,
                rate_500=rate_500,
                rate_503=rate_503,
                reset_rate=reset_rate,
                truncate_rate=truncate_rate,
                malformed_rate=malformed_rate,
                invalid_action_rate=invalid_action_rate,
                slow_rate=slow_rate,
                slow_s=slow_s,
                retry_after_s=None if retry_after < 0 else retry_after,
                reject_schema=reject_schema,
            ),
        )
    except ValueError as exc:
        raise fail(str(exc)) from None
    if invalid_action_rate and enforce_schema:
        raise fail("--invalid-action-rate needs --no-enforce-schema (an enforcing server never sends one)")
    # a setting of a fault that is never drawn would be served unread, as if it shaped the replies
    for name, flag, rate, needs, why in (
        ("retry_after", "--retry-after", rate_429, "--rate-429", "no request is answered 429"),
        ("slow_s", "--slow-s", slow_rate, "--slow-rate", "no request is delayed"),
    ):
        source = ctx.get_parameter_source(name)  # by name: typer may carry a click of its own
        if not rate and source is not None and source.name == "COMMANDLINE":
            raise fail(f"{flag} needs {needs} ({why})")
    try:
        code = serve_forever(sim, host, port, log_level=log_level)
    except OutputWriteError as exc:
        raise fail(str(exc), 1) from None
    except OSError as exc:
        hint = "; stop what holds it, or choose another --port (0 picks a free one)"
        reason = f"{exc.strerror or exc}{hint if exc.errno == errno.EADDRINUSE else ''}"
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 host in brackets
        raise fail(f"cannot listen on {address}: {reason}") from None
    raise typer.Exit(code)
