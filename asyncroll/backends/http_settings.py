"""The HTTP backend's settings, taken from a run's config (:meth:`HttpSettings.from_config`) or built
directly by tests and benches."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from asyncroll.backends.retry import RetryPolicy
from asyncroll.config import RunConfig, ServerKind


@dataclass(frozen=True)
class HttpSettings:
    """What the HTTP backend needs from a run's config (kept separate so tests and benches build it)."""

    endpoint: str
    model: str
    inflight: int
    max_tokens: int = 512
    seed: int = 0
    structured: bool = True
    replay: bool = False
    server_kind: ServerKind | None = None
    request_timeout: float = 120.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    circuit_failures: int = 5
    server_down_timeout: float = 120.0
    probe_interval: float = 0.5
    backend_name: str = "openai"
    api_key_env: str | None = None  # where the key came from (recorded); the key itself is never shown
    api_key: str | None = field(default=None, repr=False)

    @classmethod
    def from_config(cls, cfg: RunConfig) -> HttpSettings:
        assert cfg.model is not None  # RunConfig requires --model for HTTP backends
        return cls(
            endpoint=cfg.endpoint.rstrip("/"),
            model=cfg.model,
            inflight=cfg.max_inflight_model_requests,
            max_tokens=cfg.max_tokens,
            seed=cfg.seed,
            structured=cfg.structured_output,
            replay=cfg.replay,
            server_kind=cfg.declared_server_kind,
            request_timeout=cfg.request_timeout,
            retry=RetryPolicy(cfg.max_retries, max_delay=cfg.retry_max_delay),
            circuit_failures=cfg.circuit_failures,
            server_down_timeout=cfg.server_down_timeout,
            backend_name=cfg.backend,
            api_key_env=cfg.api_key_env,
            api_key=None if cfg.api_key_env is None else os.environ.get(cfg.api_key_env) or None,
        )
