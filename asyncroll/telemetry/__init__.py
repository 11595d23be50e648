"""Telemetry: what the inference server and the GPU were doing while the run ran.

* :mod:`~asyncroll.telemetry.server_metrics`: vLLM or SGLang ``/metrics`` (Prometheus text), fetched with
  httpx; parsed in :mod:`~asyncroll.telemetry.exposition` (``prometheus_client``'s parser, the wanted
  lines only); its counters become rates in :mod:`~asyncroll.telemetry.counter_rate`.
* :mod:`~asyncroll.telemetry.nvml`: GPU utilisation and memory through NVML (``nvidia-ml-py``).
* :mod:`~asyncroll.telemetry.sampler`: probes the sources before the measurement clock starts
  (``resource_probe``) and samples them every ``--telemetry-interval`` (``resource_sample``).
* :mod:`~asyncroll.telemetry.nvtx`: NVTX start/end ranges for profilers (``--nvtx``).

Telemetry is optional and never crashes a run: a source that cannot be reached is reported
*unavailable* with its reason, and a value that is missing or invalid is ``null`` and counted, never
zero. The derived metrics (sampled starvation, coverage) live in :mod:`asyncroll.outputs.resources`.
"""

#: What requests a telemetry source (said where a run has none): one wording for the sampler's note and
#: the summary's.
REQUESTED_BY = (
    "--metrics-url, or a vLLM/SGLang server declared: --server-kind vllm|sglang, the default of --backend "
    "vllm; --nvml-device"
)
