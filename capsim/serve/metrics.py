"""Prometheus metrics of ``capsim serve``, under vLLM's names (prometheus_client).

Gauges (running and waiting requests, KV-cache usage) are read from the simulation at
each scrape; counters and histograms are updated as requests finish. Latencies are the
simulated deployment's, in simulated seconds (at ``--speedup`` X they are X times the
wall-clock ones a client measures).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from capsim.serve.live import LiveDeployment, LiveRequest

LATENCY_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
"""Histogram buckets, seconds (vLLM's TTFT buckets, extended for long end-to-end times)."""


class ServeMetrics:
    """One registry per server, with vLLM's metric names and a ``model_name`` label."""

    def __init__(self, deployment: LiveDeployment, model_name: str):
        self.deployment = deployment
        self.model_name = model_name
        self.registry = CollectorRegistry()
        labels = ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=self.registry)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, [*labels, *extra], registry=self.registry)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, labels, buckets=LATENCY_BUCKETS_S, registry=self.registry)

        self.running = gauge("vllm:num_requests_running", "Requests in model execution batches")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be processed")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 means 100 percent")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prefill tokens processed")
        self.generation_tokens = counter("vllm:generation_tokens", "Generation tokens processed")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemptions")
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix-cache queries, in prompt tokens"
        )
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix-cache hits, in tokens")
        self.success = counter(
            "vllm:request_success", "Successfully processed requests", ("finished_reason",)
        )
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token, s")
        self.tpot = histogram("vllm:time_per_output_token_seconds", "Time per output token, s")
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency, s")
        cache = Gauge(
            "vllm:cache_config_info",
            "Information of the KV-cache configuration",
            ["block_size", "num_gpu_blocks"],
            registry=self.registry,
        )
        setup = deployment.setup
        cache.labels(str(setup.scheduler.block_size), str(setup.num_blocks)).set(1)
        self._seen = {"preemptions": 0, "queries": 0, "hits": 0}
        deployment.finished_listeners.append(self.observe_finished)
        deployment.aborted_listeners.append(self.observe_aborted)

    def observe_aborted(self, live: LiveRequest) -> None:
        """Count a request its client abandoned (finished_reason "abort", as vLLM's
        request_success counter does) and the tokens it had been served: its prompt once
        prefilled, its output tokens streamed so far. Its latencies are not observed."""
        m = self.model_name
        req = live.sim
        if req is not None and req.first_token is not None:
            self.prompt_tokens.labels(m).inc(req.prompt_len)
        self.generation_tokens.labels(m).inc(live.emitted)
        self.success.labels(m, "abort").inc()

    def observe_finished(self, live: LiveRequest) -> None:
        """Count a finished request and observe its latencies (simulated seconds, as a
        client sees them: front end included)."""
        req = live.sim
        if req is None or req.finish is None or req.first_token is None:
            return
        m = self.model_name
        self.prompt_tokens.labels(m).inc(req.prompt_len)
        self.generation_tokens.labels(m).inc(req.output_len)
        self.success.labels(m, "length").inc()
        ttft = req.first_token + live.delay_s - req.send
        e2e = req.finish + live.delay_s - req.send
        self.ttft.labels(m).observe(ttft)
        self.e2e.labels(m).observe(e2e)
        if req.output_len > 1:
            self.tpot.labels(m).observe((e2e - ttft) / (req.output_len - 1))

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric, gauges read now."""
        d, m = self.deployment, self.model_name
        self.running.labels(m).set(d.running())
        self.waiting.labels(m).set(d.waiting())
        self.kv_usage.labels(m).set(d.kv_usage())
        for key, value, metric in (
            ("preemptions", d.preemptions(), self.preemptions),
            ("queries", d.prefix_cache()[0], self.prefix_queries),
            ("hits", d.prefix_cache()[1], self.prefix_hits),
        ):
            if value > self._seen[key]:
                metric.labels(m).inc(value - self._seen[key])
                self._seen[key] = value
        return generate_latest(self.registry)
