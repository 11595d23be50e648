"""Settings of ``serve-sim``: the served model, the batching engine, response policy and faults."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Literal

from asyncroll.backends.server_model import ServerModelConfig
from asyncroll.serve_sim.sizes import MIN_CHARS_PER_TOKEN

MetricsFlavor = Literal["vllm", "sglang"]


@dataclass(frozen=True)
class FaultConfig:
    """Per-request fault probabilities (each in [0, 1], drawn in this order from one seeded RNG).

    ``rate_429``/``rate_500``/``rate_503``: answer that status at once (429 with ``retry-after``).
    ``reset_rate``: abort the TCP connection (RST) before any response. ``truncate_rate``: send the
    headers and half the body, then abort. ``malformed_rate``: 200 with a body that is not JSON.
    ``invalid_action_rate``: 200 with content that is not a valid action (only without schema
    enforcement, as a server that ignores ``response_format`` would). ``slow_rate``: add ``slow_s``
    seconds before the request reaches the engine. ``reject_schema``: refuse every request that carries
    a JSON schema with 400, as vLLM does for a schema its grammar backend cannot compile."""

    rate_429: float = 0.0
    rate_500: float = 0.0
    rate_503: float = 0.0
    reset_rate: float = 0.0
    truncate_rate: float = 0.0
    malformed_rate: float = 0.0
    invalid_action_rate: float = 0.0
    slow_rate: float = 0.0
    slow_s: float = 1.0
    retry_after_s: float | None = 1.0
    reject_schema: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            flag = "--retry-after" if f.name == "retry_after_s" else f"--{f.name.replace('_', '-')}"
            if isinstance(value, float) and not math.isfinite(value):  # NaN passes every `< 0` test
                raise ValueError(f"{flag} must be a finite number, got {value}")
            is_rate = f.name.endswith("rate") or f.name.startswith("rate_")
            if is_rate and not 0.0 <= value <= 1.0:
                raise ValueError(f"{flag} must be in [0, 1], got {value}")
        if self.slow_s < 0:
            raise ValueError(f"--slow-s must be >= 0, got {self.slow_s}")
        if self.retry_after_s is not None and self.retry_after_s < 0:
            raise ValueError(f"--retry-after must be >= 0, got {self.retry_after_s}")


@dataclass(frozen=True)
class SimConfig:
    model: str = "sim"
    engine: ServerModelConfig = field(default_factory=ServerModelConfig)
    chars_per_token: float = 4.0
    kv_cache_tokens: int = 262_144
    max_model_len: int = 32_768
    metrics_flavor: MetricsFlavor = "vllm"
    enforce_schema: bool = True
    seed: int = 0
    faults: FaultConfig = field(default_factory=FaultConfig)

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("--model must not be empty")
        # the engine's costs are checked by ServerModelConfig (finite, from 0 to one day)
        if not math.isfinite(self.chars_per_token):
            raise ValueError(f"--chars-per-token must be a finite number, got {self.chars_per_token}")
        if self.chars_per_token < MIN_CHARS_PER_TOKEN:  # as simulate: fewer and every request fails
            raise ValueError(
                f"--chars-per-token must be >= {MIN_CHARS_PER_TOKEN}, got {self.chars_per_token}"
            )
        if self.kv_cache_tokens < 1 or self.max_model_len < 1:
            raise ValueError("--kv-cache-tokens and --max-model-len must be >= 1")
        if self.kv_cache_tokens < self.max_model_len:  # vLLM refuses to start so: one sequence cannot fit
            raise ValueError(
                f"--max-model-len {self.max_model_len} is larger than the KV cache holds (--kv-cache-tokens "
                f"{self.kv_cache_tokens}): one sequence of that length could not fit (vLLM refuses to start "
                "so); lower --max-model-len or raise --kv-cache-tokens"
            )
        if self.metrics_flavor not in ("vllm", "sglang"):
            raise ValueError(f"--metrics-flavor must be vllm or sglang, got {self.metrics_flavor!r}")
