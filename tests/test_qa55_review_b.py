"""Review of the SGLang series rules (:func:`~asyncroll.telemetry.exposition.sglang_request_series`) on the
label combination no earlier test had all at once: ``--dp-size 2`` (dp_rank), ``--pp-size 2`` (pp_rank)
and ``--enable-priority-scheduling`` (a ``priority=""`` total beside a ``priority="<n>"`` breakdown), as
SGLang's scheduler gauges label them (tests/test_qa55_sglang.py)."""

from __future__ import annotations

from asyncroll.telemetry.exposition import SGLANG, parse_metrics

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
