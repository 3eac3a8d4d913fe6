"""Drive a real server through concurrency levels and record everything.

Workloads mean what they mean in the simulator (capsim.engine.workloads):

* ``closed``: C requests always in flight until ``requests`` are done.
* ``batch``: C requests at once; the round ends when the last finishes; ``requests`` (a
  multiple of C) per level.

Per level the server's ``/metrics`` is scraped before, every ``metrics_interval_s`` during,
and after, so the run records counter increases (tokens, preemptions, prefix-cache hits,
speculative acceptance per position) and gauge peaks (running, waiting, KV usage); a scrape
that fails or has unparseable lines is noted in the level (``metrics_note``) and warned
about once. Records are written the moment each request ends, each with its outcome (see
capsim.probe.client); on Ctrl-C the requests still in flight are written with outcome
``interrupted``, and a dead server ends the run with what it had.
"""

from __future__ import annotations

import asyncio
import os
from typing import Annotated, Literal

import httpx
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from capsim.engine.lengths import length_field, parse_length
from capsim.engine.limits import (
    MAX_CONCURRENCY,
    MAX_CONTEXT_TOKENS,
    MAX_SEED,
    MAX_TIMEOUT_S,
    MIN_TIMEOUT_S,
)
from capsim.errors import CapsimUserError
from capsim.metrics import RequestRecord
from capsim.probe.client import (
    AnswerTooLarge,
    Clock,
    RequestSpec,
    SmallAnswer,
    Timeouts,
    excerpt,
    fetch_small,
    stream_one,
)
from capsim.probe.prometheus import ScrapeLog, counter_deltas, gauge_peaks, parse_exposition
from capsim.probe.prompts import PromptFactory
from capsim.probe.runfile import Deployment, RunHeader, RunSummary, RunWriter, summarize_level

MAX_PROBE_REQUESTS = 1_000_000
"""Most requests (or batch rounds) a level of a probe may send: days of a real server."""

MAX_PROBE_RUNS = 1_000
"""Most measurement runs a level of a probe may repeat."""

MAX_PROBE_LEVEL_TOKENS = 16_000_000
"""Most prompt tokens a level may send: the probe makes every prompt of a level before
its clock starts (tokenising inside the measured window would delay each next request),
held as text or, where the server tokenises, as token ids (about 36 bytes each in
Python), so this keeps them under about 600 MB (issue 47: --requests 99999999999 took the
probe past 5 GB)."""


INFO_BYTES = 16 * 2**20
"""What the probe reads of /v1/models, /props, /get_server_info and /version."""

METRICS_BYTES = 8 * 2**20
"""What it reads of /metrics (vLLM's page is tens to hundreds of kB)."""

INFO_SECONDS = 10.0
"""The longest /v1/models may take to answer whole (a server that sends a byte every
few seconds never trips a read timeout), and no more than --timeout: a server answers it
from memory in milliseconds, even under load, and a probe that waited 30 s on one that
dripped bytes read as hung."""


def served_models(answer: SmallAnswer) -> list[dict] | None:
    """The model entries of a /v1/models answer (each a dict with a string id), or None
    when it is not an OpenAI model list."""
    try:
        listed = answer.json()
    except ValueError:
        return None
    models = listed.get("data") if isinstance(listed, dict) else None
    if not isinstance(models, list) or not all(
        isinstance(m, dict) and isinstance(m.get("id"), str) for m in models
    ):
        return None
    return models


class ProbeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str
    model: str
    endpoint: Literal["completions", "chat"] = "completions"
    workload: Literal["closed", "batch"] = "closed"
    concurrency: list[Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)]] = Field(
        min_length=1, description="Concurrency levels, each at least 1"
    )
    requests: int | None = Field(
        None, ge=1, le=MAX_PROBE_REQUESTS, description="Requests per level"
    )
    rounds: int = Field(
        2, ge=1, le=MAX_PROBE_REQUESTS, description="Batch rounds per level without --requests"
    )
    input_tokens: int = Field(1024, ge=1, le=MAX_CONTEXT_TOKENS)
    output_tokens: int | str = Field(
        512, description="N, or a distribution as in capsim predict (uniform:A,B, ...)"
    )
    seed: int = Field(
        0, ge=0, le=MAX_SEED, description="Draws output lengths as the simulator does"
    )
    runs: int = Field(1, ge=1, le=MAX_PROBE_RUNS)
    ignore_eos: StrictBool = True
    warmup: StrictBool = True
    api_key_env: str | None = "OPENAI_API_KEY"
    timeout_s: float = Field(
        600.0, ge=MIN_TIMEOUT_S, le=MAX_TIMEOUT_S, description="Whole request, seconds"
    )
    connect_timeout_s: float | None = Field(
        None,
        ge=MIN_TIMEOUT_S,
        le=MAX_TIMEOUT_S,
        description="Opening a connection, seconds (default 10, at most timeout_s)",
    )
    first_byte_timeout_s: float | None = Field(
        None,
        ge=MIN_TIMEOUT_S,
        le=MAX_TIMEOUT_S,
        description="Send to first event, seconds (default 300, at most timeout_s)",
    )
    chunk_timeout_s: float | None = Field(
        None,
        ge=MIN_TIMEOUT_S,
        le=MAX_TIMEOUT_S,
        description="Longest gap between events, seconds (default 60, at most timeout_s)",
    )
    metrics_interval_s: float = Field(1.0, gt=0)
    deployment: Deployment = Field(default_factory=Deployment)

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        try:
            url = httpx.URL(v)
        except (httpx.InvalidURL, ValueError, TypeError) as exc:
            raise ValueError(f"'{v}' is not a URL ({exc})") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"'{v}' must be http://HOST[:PORT] or https://...")
        return v

    @field_validator("output_tokens")
    @classmethod
    def _output_length(cls, v: int | str) -> int | str:
        return length_field(v, "--output-tokens")

    @model_validator(mode="after")
    def _prompts_within_memory(self) -> ProbeConfig:
        level = max(self.requests_for(c) for c in self.concurrency)
        if level * self.input_tokens > MAX_PROBE_LEVEL_TOKENS:
            raise ValueError(
                f"a level of {level:,} requests of {self.input_tokens:,} prompt tokens is "
                f"{level * self.input_tokens:,} tokens, above the {MAX_PROBE_LEVEL_TOKENS:,} "
                "the probe prepares before a level's clock starts: send fewer requests or "
                "shorter prompts a level"
            )
        return self

    @model_validator(mode="after")
    def _limits_within_total(self) -> ProbeConfig:
        for name, value in (
            ("first-byte", self.first_byte_timeout_s),
            ("chunk", self.chunk_timeout_s),
            ("connect", self.connect_timeout_s),
        ):
            if value is not None and value > self.timeout_s:
                raise ValueError(
                    f"the {name} timeout ({value:g} s) is longer than the total timeout "
                    f"({self.timeout_s:g} s), which would always end the request first"
                )
        return self

    def timeouts(self) -> Timeouts:
        """The per-request limits; an unset one is its default, capped at the total."""
        default = Timeouts()
        return Timeouts(
            connect=self.connect_timeout_s or min(default.connect, self.timeout_s),
            first_byte=self.first_byte_timeout_s or min(default.first_byte, self.timeout_s),
            chunk=self.chunk_timeout_s or min(default.chunk, self.timeout_s),
            total=self.timeout_s,
        )

    def requests_for(self, c: int) -> int:
        if self.requests is not None:
            return self.requests
        return c * self.rounds if self.workload == "batch" else max(4 * c, 16)


def without_password(url: str) -> str:
    """``url`` with the password of its user information masked (http://user:***@host):
    messages and run files name the server, never its credentials."""
    parsed = httpx.URL(url)
    if not parsed.password:
        return url
    return str(parsed.copy_with(username=parsed.username, password="***"))


class ServerGone(Exception):
    """The server stopped answering."""


class Prober:
    def __init__(self, config: ProbeConfig, writer_factory, progress=None):
        self.cfg = config
        self.url = config.url.rstrip("/")
        self.sent = 0  # measured requests sent (warm-up ones are not)
        self.shown_url = without_password(self.url)  # what messages and the run file say
        self.writer_factory = writer_factory
        self.clock = Clock()
        key = os.environ.get(config.api_key_env or "", "") if config.api_key_env else ""
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.prompts = PromptFactory(self.url, config.model, config.endpoint)
        self.in_flight: dict[str, tuple[RequestRecord, int, int]] = {}
        self.timeouts = config.timeouts()
        self.info_seconds = min(INFO_SECONDS, config.timeout_s)
        self.scrapes = ScrapeLog()
        self.warned: set[str] = set()
        # progress(event, **info): "level" when a level starts (total requests), "request"
        # when one ends (its record), "warning" once per kind of /metrics trouble (message);
        # the CLI draws a rich progress bar from these and prints the warnings
        self.progress = progress or (lambda event, **info: None)

    def warn_once(self, kind: str, message: str) -> None:
        if kind not in self.warned:
            self.warned.add(kind)
            self.progress("warning", message=message)

    async def scrape(self, client: httpx.AsyncClient) -> dict:
        """The server's known /metrics series ({} when the scrape fails); failures and
        unparseable lines go to ``self.scrapes`` and are warned about once."""
        try:
            r = await fetch_small(
                client, "GET", self.url + "/metrics", METRICS_BYTES, 10, headers=self.headers
            )
        except (httpx.HTTPError, TimeoutError, AnswerTooLarge) as exc:
            problem = exc.__class__.__name__
            if isinstance(exc, AnswerTooLarge):
                problem = f"the page has {exc}"
        else:
            if r.status_code == 200:
                exposition = self.scrapes.add(parse_exposition(r.text))
                if exposition.skipped:
                    self.warn_once(
                        "unparseable",
                        f"{self.shown_url}/metrics has lines that are not Prometheus text (first: "
                        f"{exposition.first_skipped!r}); they are skipped and counted in "
                        "each level's metrics_note",
                    )
                return exposition.values
            problem = f"HTTP {r.status_code}"
        self.scrapes.fail(problem)
        self.warn_once(
            "scrape",
            f"{self.shown_url}/metrics failed ({problem}); the server's counters are not recorded "
            "where it fails",
        )
        return {}

    async def discover(self, client: httpx.AsyncClient) -> dict:
        """What the server says about itself."""
        info: dict = {}
        try:
            r = await fetch_small(
                client,
                "GET",
                self.url + "/v1/models",
                INFO_BYTES,
                self.info_seconds,
                headers=self.headers,
            )
        except (httpx.HTTPError, TimeoutError, AnswerTooLarge) as exc:
            what = {
                TimeoutError: f"no whole answer from /v1/models within {self.info_seconds:g} s",
                AnswerTooLarge: f"/v1/models answered {exc}",
            }.get(type(exc))
            raise CapsimUserError(
                f"cannot read {self.shown_url}: {what}"
                if what
                else f"cannot reach {self.shown_url}: {exc.__class__.__name__}",
                hint="check --url and that the server is running",
            ) from None
        if r.status_code != 200:
            raise CapsimUserError(f"{self.shown_url}/v1/models answered HTTP {r.status_code}")
        models = served_models(r)
        if models is None:
            raise CapsimUserError(
                f"{self.shown_url}/v1/models did not answer an OpenAI model list "
                f'({{"data": [{{"id": ...}}, ...]}}): {excerpt(r.text)!r}',
                hint="check --url: it is the server's root, without /v1",
            )
        ids = [m["id"] for m in models]
        if self.cfg.model not in ids:
            raise CapsimUserError(
                f"the server does not serve model '{self.cfg.model}'",
                suggestions=ids[:5],
                hint="pass --model with one of the served ids",
            )
        entry = next(m for m in models if m["id"] == self.cfg.model)
        info["models"] = models
        info["owned_by"] = entry.get("owned_by")
        info["max_model_len"] = entry.get("max_model_len")
        for path in ("/props", "/get_server_info", "/version"):
            try:
                rr = await fetch_small(
                    client, "GET", self.url + path, INFO_BYTES, 10, headers=self.headers
                )
                if rr.status_code == 200:
                    info[path.strip("/")] = rr.json()
            except (httpx.HTTPError, ValueError, TimeoutError, AnswerTooLarge):
                continue
        metrics = await self.scrape(client)
        if "cache_config" in metrics:
            info["cache_config"] = metrics["cache_config"]
        info["exact_prompt_tokens"] = await self.prompts.setup(client)
        return info

    async def build_prompts(self, client, keys: list[str]) -> dict[str, str | list[int]]:
        """Every prompt of a level, made before its clock starts (tokenising through the
        server inside the measured window would delay each next request)."""
        limit = asyncio.Semaphore(8)

        async def build(key: str):
            async with limit:
                return key, await self.prompts.prompt(client, key, self.cfg.input_tokens)

        return dict(await asyncio.gather(*(build(k) for k in keys)))

    async def stream(self, client: httpx.AsyncClient, spec: RequestSpec) -> RequestRecord:
        """One streaming request to the server under test, with the run's limits."""
        return await stream_one(
            client,
            self.url,
            self.cfg.model,
            self.cfg.endpoint,
            spec,
            self.clock,
            self.headers,
            self.timeouts,
        )

    async def one(
        self,
        client,
        writer: RunWriter,
        key: str,
        c: int,
        run: int,
        max_tokens: int,
        prompt: str | list[int],
    ) -> RequestRecord:
        spec = RequestSpec(key, prompt, max_tokens, self.cfg.ignore_eos)
        placeholder = RequestRecord(request_id=key, send=self.clock(), max_tokens=max_tokens)
        self.in_flight[key] = (placeholder, c, run)
        self.sent += 1
        record = await self.stream(client, spec)
        self.in_flight.pop(key, None)
        if isinstance(prompt, str) and record.input_tokens:
            self.prompts.observe(len(prompt.split()), record.input_tokens)
        writer.request(record, c, run)
        self.progress("request", record=record)
        return record

    async def level(self, client, writer: RunWriter, c: int, run: int) -> list[RequestRecord]:
        n = self.cfg.requests_for(c)
        if self.cfg.workload == "batch" and n % c:
            raise CapsimUserError(f"--requests {n} is not a multiple of concurrency {c}")
        records: list[RequestRecord] = []
        keys = [f"r{run}-c{c}-{i}" for i in range(n)]
        # the same generator, order and draws as capsim.engine.workloads.Driver
        rng = np.random.default_rng(self.cfg.seed)
        parse_length(str(self.cfg.input_tokens), "--input-tokens").tokens(rng, n)
        outputs = parse_length(str(self.cfg.output_tokens), "--output-tokens").tokens(rng, n)
        length = dict(zip(keys, (int(o) for o in outputs), strict=True))
        prompts = await self.build_prompts(client, keys)
        self.progress("level", concurrency=c, run=run, total=n)

        if self.cfg.workload == "batch":
            for start in range(0, n, c):
                batch = keys[start : start + c]
                records += await asyncio.gather(
                    *(self.one(client, writer, k, c, run, length[k], prompts[k]) for k in batch)
                )
                self._check_alive(records)
        else:
            queue = iter(keys)

            async def worker():
                for key in queue:
                    records.append(
                        await self.one(client, writer, key, c, run, length[key], prompts[key])
                    )
                    self._check_alive(records)

            await asyncio.gather(*(worker() for _ in range(min(c, n))))
        return records

    @staticmethod
    def _check_alive(records: list[RequestRecord]) -> None:
        recent = records[-4:]
        if len(recent) >= 2 and all(r.outcome == "connection_error" for r in recent):
            raise ServerGone(recent[-1].error)

    async def warmup(self, client: httpx.AsyncClient, n: int) -> None:
        """A few short requests so the first level does not pay for cold caches."""

        async def one(i: int) -> None:
            prompt = await self.prompts.prompt(
                client, f"warmup-{i}", min(self.cfg.input_tokens, 64)
            )
            await self.stream(client, RequestSpec(f"warmup-{i}", prompt, 8, self.cfg.ignore_eos))

        await asyncio.gather(*(one(i) for i in range(n)))

    async def sample_metrics(self, client, samples: list[dict], stop: asyncio.Event):
        """Scrape every ``metrics_interval_s`` until ``stop``, the first one interval after
        the level starts: the scrape just before it stands for its start, and one at the
        instant of its first burst would hold those requests up while the server renders
        its metrics (milliseconds on a busy host, a first token's tenth at a high
        ``capsim serve --speedup``)."""
        while True:
            try:
                await asyncio.wait_for(stop.wait(), self.cfg.metrics_interval_s)
                return
            except TimeoutError:
                samples.append(await self.scrape(client))

    async def run(self) -> RunSummary:
        cfg = self.cfg
        limits = httpx.Limits(
            max_connections=max(cfg.concurrency) + 16,
            max_keepalive_connections=max(cfg.concurrency) + 16,
        )
        # connecting is httpx's to time; stream_one times the first byte, gaps and total
        timeout = httpx.Timeout(None, connect=self.timeouts.connect)
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            server = await self.discover(client)
            header = RunHeader(
                url=self.shown_url,
                model=cfg.model,
                endpoint=cfg.endpoint,
                workload=cfg.workload,
                concurrency=cfg.concurrency,
                requests_per_level=cfg.requests,
                runs=cfg.runs,
                input_tokens=cfg.input_tokens,
                output_tokens=cfg.output_tokens,
                ignore_eos=cfg.ignore_eos,
                deployment=cfg.deployment,
                server=server,
                capsim_version=_version(),
            )
            writer = self.writer_factory(header)
            complete = discarded = interrupted = False
            stopped = None
            try:
                if cfg.warmup:
                    await self.warmup(client, min(max(cfg.concurrency), 4))
                for run in range(cfg.runs):
                    for c in cfg.concurrency:
                        self.scrapes = ScrapeLog()
                        before = await self.scrape(client)
                        samples: list[dict] = []
                        stop = asyncio.Event()
                        sampler = asyncio.create_task(self.sample_metrics(client, samples, stop))
                        try:
                            records = await self.level(client, writer, c, run)
                        finally:
                            stop.set()
                            await sampler
                        after = await self.scrape(client)
                        writer.add_level(
                            summarize_level(
                                records,
                                c,
                                run,
                                cfg.workload,
                                server_deltas=counter_deltas(before, after),
                                server_peaks=gauge_peaks([before, *samples, after]),
                                metrics_note=self.scrapes.note(),
                            )
                        )
                complete = True
            except ServerGone as exc:
                stopped = f"the server stopped answering ({exc})"
            except (asyncio.CancelledError, KeyboardInterrupt):
                interrupted = True  # said once the run file is closed, below
            except CapsimUserError:
                # refused before anything was measured (a prompt the server would not
                # tokenise): no run file is left behind to be --force'd on the next try
                if not self.sent:  # a level or a request in flight has sent one
                    writer.discard()
                    discarded = True
                raise
            finally:
                if not discarded:
                    for placeholder, c, run in list(self.in_flight.values()):
                        placeholder.outcome = "interrupted"
                        placeholder.error = "interrupted: the run stopped before it finished"
                        placeholder.finish = self.clock()
                        writer.request(placeholder, c, run)
                    self.in_flight.clear()
                    writer.close(complete, stopped)
            if interrupted:  # Ctrl-C or SIGTERM: the caller says what was kept, exit 130
                raise KeyboardInterrupt
            return writer.summary


def _version() -> str:
    from capsim import __version__

    return __version__


def run_probe(config: ProbeConfig, out, progress=None) -> RunSummary:
    """Run a probe and write ``out`` (.json summary and .jsonl log)."""
    prober = Prober(config, lambda header: RunWriter(out, header), progress)
    return asyncio.run(prober.run())
