"""``asyncroll serve-sim``: an OpenAI-compatible inference-server simulator on loopback.

A real ASGI app (Starlette on uvicorn) that puts an HTTP front end on the batching inference-server model
of :mod:`asyncroll.backends.server_model` (the same implementation the simulator uses, here on the system
clock): ``POST /v1/chat/completions``, ``GET /health``, ``GET /v1/models``, ``GET /metrics`` (vLLM's or
SGLang's Prometheus names) and ``GET /sim/stats`` (the simulator's own counters, peak concurrency first).
Fault injection is seeded. Users test agent infrastructure without a GPU; asyncroll's tests use it as the
server every HTTP test talks to.
"""
