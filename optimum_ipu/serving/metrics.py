"""The server's Prometheus metrics (`GET /metrics`), in a registry of its own: two servers in one process (tests,
or an application mounting the ASGI app twice) count apart, and nothing of the process's default registry leaks in.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# seconds: from a few milliseconds (a classification at batch 1) to the longest generations
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServerMetrics:
    """Requests by endpoint and status, request latency, batch sizes (inputs per pipeline call), the queue's depth,
    requests in flight, and prompt / generated tokens; with continuous batching, its requests, and with this project's
    engine its rows decoding and waiting (the batch and the queue of that path).

    Args:
        prefix (`str`, *optional*, defaults to `"optimum_ipu"`): the metrics' name prefix.
    """

    def __init__(self, prefix: str = "optimum_ipu") -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(f"{prefix}_requests", "HTTP requests answered", ["endpoint", "status"], registry=r)
        self.latency = Histogram(
            f"{prefix}_request_seconds", "time to answer a request", ["endpoint"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.batch_size = Histogram(
            f"{prefix}_batch_size",
            "inputs handed to the pipeline in one call",
            ["task"],
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.batch_seconds = Histogram(
            f"{prefix}_batch_seconds", "time of one pipeline call", ["task"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.queue_depth = Gauge(f"{prefix}_queue_depth", "requests waiting for a batch", registry=r)
        self.in_flight = Gauge(f"{prefix}_requests_in_flight", "requests being answered", registry=r)
        self.prompt_tokens = Counter(f"{prefix}_prompt_tokens", "prompt tokens of generation requests", registry=r)
        self.generated_tokens = Counter(f"{prefix}_generated_tokens", "tokens generated", registry=r)
        self.continuous_requests = Gauge(
            f"{prefix}_continuous_requests", "requests in continuous batching, decoding or waiting", registry=r
        )
        self.continuous_rows = Gauge(
            f"{prefix}_continuous_rows",
            "rows of continuous batching by this project's engine: decoding, or waiting to join",
            ["state"],
            registry=r,
        )
        self.rejected = Counter(
            f"{prefix}_rejected_requests", "requests refused before running", ["reason"], registry=r
        )

    def render(self) -> tuple[bytes, str]:
        """The text exposition format and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
