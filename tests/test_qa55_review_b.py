"""Review of the SGLang series rules (:func:`~asyncroll.telemetry.exposition.sglang_request_series`) on the
label combination no earlier test had all at once: ``--dp-size 2`` (dp_rank), ``--pp-size 2`` (pp_rank)
and ``--enable-priority-scheduling`` (a ``priority=""`` total beside a ``priority="<n>"`` breakdown), as
SGLang's scheduler gauges label them (tests/test_qa55_sglang.py); and serve-sim's connection lookup for a
request a local proxy forwarded (``X-Forwarded-For``)."""

from __future__ import annotations

import httpx
import pytest

from asyncroll.serve_sim.config import FaultConfig
from asyncroll.telemetry.exposition import SGLANG, parse_metrics
from tests.sim_servers import body, sim

M = "Qwen/Qwen3-8B"


def _exposition() -> str:
    """Each DP rank's two pipeline stages report the same requests; rank 0 runs 5 (3 of priority 0, 2 of
    priority 10) and queues 1, rank 1 runs 9 and queues 4: 14 running, 5 waiting in all."""
    lines = []
    for dp, tp, running, waiting in (("0", "0", (5, 3, 2), 1), ("1", "4", (9, 3, 6), 4)):
        for pp in ("0", "1"):
            labels = (
                f'dp_rank="{dp}",engine_type="unified",model_name="{M}",moe_ep_rank="0",pp_rank="{pp}",'
                f'tp_rank="{tp}"'
            )
            for priority, value in zip(("", "0", "10"), running, strict=True):
                lines.append(f'sglang:num_running_reqs{{{labels},priority="{priority}"}} {value}.0')
            lines.append(f'sglang:num_queue_reqs{{{labels},priority=""}} {waiting}.0')
            lines.append(f'sglang:num_queue_reqs{{{labels},priority="0"}} {waiting}.0')
            lines.append(f'sglang:token_usage{{{labels},priority=""}} 0.{dp}5')
    lines.append(f'sglang:prompt_tokens_total{{engine_type="unified",model_name="{M}",priority="0"}} 7.0')
    lines.append(f'sglang:prompt_tokens_total{{engine_type="unified",model_name="{M}",priority="10"}} 3.0')
    lines.append(f'sglang:generation_tokens_total{{engine_type="unified",model_name="{M}",priority="0"}} 2.0')
    return "\n".join(lines) + "\n"


def test_dp_ranks_pipeline_stages_and_a_priority_breakdown_together_count_each_request_once() -> None:
    reading = parse_metrics(_exposition(), SGLANG, M)
    assert (reading.running, reading.waiting) == (14.0, 5.0)
    assert reading.kv_cache_usage == 0.15  # the fuller DP rank's
    assert sum(reading.prompt_tokens.values()) == 10.0  # counters: every priority's series summed
    assert reading.nulls == {}


@pytest.mark.timeout(30)
def test_a_request_forwarded_by_a_local_proxy_still_gets_its_connection_fault() -> None:
    """serve-sim finds a request's connection by its client address (the reset and truncate faults, a
    stream whose reader left, the stop's cut); uvicorn's proxy headers (on by default, trusted from
    127.0.0.1) rewrote that address from ``X-Forwarded-For``, as a local nginx or sidecar sends it: the
    connection was not found, and the reset fault answered uvicorn's 500 instead of a reset."""
    forwarded = {"x-forwarded-for": "10.1.2.3"}
    with sim(faults=FaultConfig(reset_rate=1.0)) as (running, client):
        with pytest.raises(httpx.TransportError):
            client.post("/v1/chat/completions", json=body(), headers=forwarded)
        assert running.stats()["statuses"] == {"reset": 1}
    with sim(faults=FaultConfig(truncate_rate=1.0)) as (running, client):
        with pytest.raises(httpx.RemoteProtocolError):
            client.post("/v1/chat/completions", json=body(), headers=forwarded)
        assert running.stats()["statuses"] == {"truncated": 1}
