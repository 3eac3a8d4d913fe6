"""Turn other tools' benchmark results into capsim run files, so existing measurements
become calibration data.

* ``vllm-bench``: the JSON of ``vllm bench serve --save-result`` (one level per file; with
  ``--save-detailed`` it also holds per-request ``input_lens``, ``output_lens``, ``ttfts``
  and ``itls`` in seconds).
* ``guidellm``: ``benchmarks.json`` of ``guidellm benchmark`` (one level per benchmark).
* ``aiperf``: ``profile_export_aiperf.json`` of ``aiperf profile`` (one level per file).

These tools keep no per-request send times, so capsim takes their aggregates as they
report them (output tok/s over their own benchmark duration; latency means and
percentiles) rather than recomputing them, and records which tool and definition each
figure came from. The workload is ``closed`` (fixed concurrency) when the tool ran with a
concurrency limit.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from capsim.errors import CapsimUserError
from capsim.files import loads_json
from capsim.metrics import Distribution, LevelMetrics, RequestRecord
from capsim.probe.import_checks import check_level_means, check_vllm_bench_aggregates
from capsim.probe.runfile import LevelSummary, RunHeader, RunSummary, RunWriter, first_problem

FORMATS = ("vllm-bench", "guidellm", "aiperf")

MAX_IMPORTED_REQUESTS = 100_000
"""Most per-request records one import writes (about 40 us each here: 100,000 in about 4 s).
A result holding more (a 51 MB vllm bench file of 1.5 million requests took 150 s, issue
47's 'import hangs') keeps its level aggregates, which calibration reads, and no
per-request records, with a note; the largest published runs hold tens of thousands."""


def _read(path: Path) -> Any:
    from capsim.files import read_input_text

    text = read_input_text(path, "benchmark result")
    try:
        return loads_json(text)
    except json.JSONDecodeError as exc:
        raise CapsimUserError(f"'{path}' is not valid JSON: {exc}") from None


def _dist(
    mean=None, p50=None, p90=None, p99=None, scale: float = 1.0, name: str = "a latency"
) -> Distribution:
    def s(v):
        return None if v is None else _measure(name, v) * scale

    return Distribution(mean=s(mean), p50=s(p50), p90=s(p90), p99=s(p99), count=0)


PER_REQUEST_KEYS = ("ttfts", "itls", "input_lens", "output_lens", "errors")
"""The per-request lists of a detailed vllm bench result: one entry a request each."""


MAX_MEASURED = 1e9
"""Largest count, time or rate a result file may give (tokens or requests a second,
seconds, milliseconds): a billion tokens a second is past any cluster's."""


def _measure(name: str, value: Any) -> float:
    """A measured count, time or rate from a result file: a finite number from 0 to
    MAX_MEASURED (a negative one would pass through to negative TTFTs and throughputs,
    1e300 tok/s to every figure calibration reads)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        # '"8"' read as 8: a result file writes its numbers as numbers
        raise ValueError(f"{name} must be a number, not {value!r:.40}")
    number = float(value)
    if not (math.isfinite(number) and 0 <= number <= MAX_MEASURED):
        raise ValueError(
            f"{name} must be a finite number from 0 to {MAX_MEASURED:,.0f}, not {value!r}"
        )
    return number


def _a_time(name: str, value: Any) -> float:
    """A per-request time of a result file: a finite number (not a boolean, a text or
    null); its sign is left to the request record's own checks, which say which request
    and which of its times."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, not {value!r:.40}")
    if not (math.isfinite(value) and abs(value) <= MAX_MEASURED):
        raise ValueError(f"{name} must be a finite number, not {value!r}")
    return float(value)


def _whole(name: str, value: Any) -> int:
    """A measured count or concurrency: a whole number, 0 or more (null reads as 0)."""
    if value is None:
        return 0
    number = _measure(name, value)
    if not number.is_integer():
        raise ValueError(f"{name} must be a whole number, not {value!r}")
    return int(number)


def _require(data: dict, keys: tuple[str, ...], path: Path, tool: str) -> None:
    missing = [k for k in keys if k not in data]
    if missing:
        raise CapsimUserError(
            f"'{path}' does not look like a {tool} result: missing {', '.join(missing)}",
            hint=f"pass the JSON file {tool} wrote",
        )


def check_per_request_lists(d: dict, completed: int) -> None:
    """A ValueError when a result's per-request lists contradict its totals: more requests
    carry an error than ``completed`` leaves failed (vllm bench writes '' for a request that
    succeeded), or an output length is not a whole number of 0 or more, or every output
    length is 0 where tokens were counted; or when a TTFT, an inter-token gap or an input
    length is not a number of 0 or more (a boolean, a text, null: true was a TTFT of 1 s)."""
    errors = d.get("errors") or []
    if errors:
        if not all(e is None or isinstance(e, str) for e in errors):
            raise ValueError("errors must hold one string a request ('' where it succeeded)")
        erred = sum(1 for e in errors if e)
        if completed > len(errors) - erred:
            raise ValueError(
                f"completed says {completed} requests, yet {erred} of the {len(errors)} "
                "requests carry an error"
            )
    outs = d.get("output_lens") or []
    for n in outs:
        if isinstance(n, bool) or not isinstance(n, int | float) or not n >= 0:
            raise ValueError(f"output_lens holds {n!r}, not a count of tokens")
        if not float(n).is_integer():
            raise ValueError(f"output_lens holds {n!r}, not a whole number of tokens")
    for name in ("ttfts", "input_lens", "itls"):
        if d.get(name) is not None and not isinstance(d[name], list):
            raise ValueError(f"{name} must be a list, one entry a request, not {d[name]!r:.40}")
    for n in d.get("ttfts") or []:  # true was a TTFT of 1 s
        _a_time("ttfts", n)
    for n in d.get("input_lens") or []:  # true was a prompt of one token
        if not _measure("input_lens", n).is_integer():
            raise ValueError(f"input_lens holds {n!r}, not a whole number of tokens")
    for gaps in d.get("itls") or []:
        if not isinstance(gaps, list):
            raise ValueError(f"itls holds {gaps!r:.40}, not a list of one request's gaps")
        for gap in gaps:
            _a_time("itls", gap)
    if outs and not any(outs) and float(d.get("total_output_tokens") or 0) > 0:
        raise ValueError(
            f"every output length is 0, yet total_output_tokens is {d['total_output_tokens']!r}"
        )


def import_vllm_bench(
    path: Path,
) -> tuple[RunHeader, Callable[[], list[LevelSummary]], Iterator[RequestRecord]]:
    d = _read(path)
    if not isinstance(d, dict):
        raise CapsimUserError(f"'{path}' does not hold a vllm bench result object")
    _require(
        d,
        ("duration", "completed", "total_output_tokens", "output_throughput"),
        path,
        "vllm bench serve",
    )
    given = d.get("max_concurrency")  # null: no limit (an open loop at a request rate)
    if given is not None and (
        isinstance(given, bool) or not isinstance(given, int | float) or not given >= 1
    ):
        raise ValueError(
            f"max_concurrency must be null or a whole number of 1 or more, not {given!r}"
        )
    if given is not None and not float(given).is_integer():
        raise ValueError(f"max_concurrency must be a whole number, not {given!r}")
    concurrency = int(given or 0)
    for key in ("model_id", "model", "base_url", "backend"):
        if d.get(key) is not None and not isinstance(d[key], str):
            raise ValueError(f"{key} must be a string, not {d[key]!r}")
    per_request = [k for k in PER_REQUEST_KEYS if d.get(k)]
    lengths = {k: len(d[k]) if isinstance(d[k], list) else None for k in per_request}
    if any(n is None for n in lengths.values()) or len(set(lengths.values())) > 1:
        shown = ", ".join(f"{k} {n if n is not None else 'not a list'}" for k, n in lengths.items())
        raise ValueError(f"the per-request lists must be lists of one length ({shown})")
    completed = int(_measure("completed", d["completed"]))
    failed = int(
        _measure("failed", d.get("failed", d.get("num_prompts", completed) - completed) or 0)
    )
    measured = (
        "duration",
        "total_output_tokens",
        "output_throughput",
        "total_input_tokens",
        "total_token_throughput",
        "request_throughput",
    )
    for key in measured:
        if key in d:
            _measure(key, d[key])
    if completed and not _measure("duration", d["duration"]) > 0:
        raise ValueError(f"duration is {d['duration']!r} for {completed} completed requests")
    check_per_request_lists(d, completed)

    def metric(name: str, scale: float = 1.0) -> Distribution:
        return _dist(
            d.get(f"mean_{name}"),
            d.get(f"median_{name}"),
            d.get(f"p90_{name}"),
            d.get(f"p99_{name}"),
            scale,
            f"a {name} figure",
        )

    e2e = metric("e2el_ms", 1e-3)
    rates: list[float] = []  # each ok request's output tok/s, gathered as records stream

    def records() -> Iterator[RequestRecord]:
        """One record per request, made as the writer asks (a detailed result of many
        thousand requests is never held as records all at once)."""
        ttfts = d.get("ttfts") or []
        if not (ttfts and d.get("output_lens")):
            return
        if len(ttfts) > MAX_IMPORTED_REQUESTS:
            from capsim.notices import notice

            notice(
                f"'{path.name}' holds per-request times of {len(ttfts):,} requests, more "
                f"than the {MAX_IMPORTED_REQUESTS:,} capsim imports: the level's aggregates "
                "are imported, no per-request records"
            )
            return
        itls = d.get("itls") or []
        input_lens = d.get("input_lens") or []
        errors = d.get("errors") or []
        for i, (ttft, out) in enumerate(zip(ttfts, d["output_lens"], strict=False)):
            gaps = itls[i] if i < len(itls) else []
            chunk_times = list(itertools.accumulate(gaps, initial=ttft))
            record = RequestRecord(
                request_id=f"vllm-bench-{i}",
                send=0.0,
                first_token=ttft,
                finish=chunk_times[-1],
                input_tokens=int(input_lens[i]) if i < len(input_lens) else 0,
                output_tokens=int(out),
                chunk_times=chunk_times,
                chunk_tokens=[1] * len(chunk_times),
                error=(errors[i] if i < len(errors) else None) or None,
            )
            if record.ok and record.output_tok_s is not None:
                rates.append(record.output_tok_s)
            yield record

    duration = float(d["duration"])
    metrics = LevelMetrics(
        concurrency=int(concurrency) or None,
        workload="closed" if concurrency else "open",
        requests=completed + failed,
        completed=completed,
        failed=failed,
        wall_s=duration,
        input_tokens=int(d.get("total_input_tokens", 0)),
        output_tokens=int(d["total_output_tokens"]),
        output_tok_s=float(d["output_throughput"]),
        total_tok_s=float(d.get("total_token_throughput", 0.0)),
        prefill_tok_s=float(d.get("total_input_tokens", 0)) / duration if duration else 0.0,
        request_throughput=float(d.get("request_throughput", 0.0)),
        per_request_output_tok_s=_dist(),
        ttft_ms=metric("ttft_ms"),
        tpot_ms=metric("tpot_ms"),
        itl_ms=metric("itl_ms"),
        e2e_s=e2e,
        queueing_ms=_dist(),
    )
    check_vllm_bench_aggregates(d, completed, failed)  # each figure checked on its own first
    header = RunHeader(
        url=str(d.get("base_url") or d.get("backend") or "unknown"),
        model=str(d.get("model_id") or d.get("model") or "unknown"),
        workload=metrics.workload,
        concurrency=[int(concurrency)] if concurrency else [],
        requests_per_level=completed + failed,
        source="vllm-bench",
        server={
            "imported_from": str(path),
            "date": d.get("date"),
            "request_rate": d.get("request_rate"),
        },
    )

    def levels() -> list[LevelSummary]:
        """The level, once the records have been read (their per-request rates)."""
        if rates:
            metrics.per_request_output_tok_s = Distribution.of(rates)
        return [LevelSummary(concurrency=int(concurrency or 0), run=0, metrics=metrics)]

    return header, levels, records()


def import_guidellm(path: Path) -> tuple[RunHeader, list[LevelSummary], list[RequestRecord]]:
    d = _read(path)
    benchmarks = d.get("benchmarks") if isinstance(d, dict) else None
    if not benchmarks:
        raise CapsimUserError(
            f"'{path}' has no 'benchmarks' list; is it guidellm's benchmarks.json?"
        )
    levels = []
    model = "unknown"
    for i, b in enumerate(benchmarks):
        m = b.get("metrics") or {}
        if not m:
            raise CapsimUserError(f"'{path}': benchmark {i} has no metrics")

        def stat(name: str, scale: float = 1.0, m=m) -> Distribution:
            s = (m.get(name) or {}).get("successful") or {}
            pct = s.get("percentiles") or {}
            return _dist(
                s.get("mean"),
                s.get("median", pct.get("p50")),
                pct.get("p90"),
                pct.get("p99"),
                scale,
            )

        strategy = (b.get("args") or b.get("config") or {}).get("strategy") or {}
        concurrency = _whole(
            "the strategy's streams", strategy.get("streams") or strategy.get("max_concurrency")
        )
        if "streams" in strategy and concurrency < 1:  # read as an open workload before
            raise ValueError("the strategy's streams must be 1 or more")
        totals = m.get("request_totals") or {}
        completed = _whole("request_totals.successful", totals.get("successful"))
        failed = _whole("request_totals.errored", totals.get("errored")) + _whole(
            "request_totals.incomplete", totals.get("incomplete")
        )
        out = stat("output_tokens_per_second")
        total = stat("tokens_per_second")
        start, end = b.get("start_time"), b.get("end_time")
        wall = float(end - start) if start is not None and end is not None else 0.0
        model = ((b.get("args") or b.get("config") or {}).get("model")) or model
        metrics = LevelMetrics(
            concurrency=concurrency or None,
            workload="closed" if concurrency else "open",
            requests=completed + failed,
            completed=completed,
            failed=failed,
            wall_s=wall,
            input_tokens=0,
            output_tokens=0,
            output_tok_s=out.mean or 0.0,
            total_tok_s=total.mean or 0.0,
            prefill_tok_s=0.0,
            request_throughput=stat("requests_per_second").mean or 0.0,
            per_request_output_tok_s=_dist(),
            ttft_ms=stat("time_to_first_token_ms"),
            # guidellm's inter-token latency is the per-request mean after the first token
            tpot_ms=stat("inter_token_latency_ms"),
            itl_ms=_dist(),
            e2e_s=stat("request_latency"),
            queueing_ms=_dist(),
        )
        levels.append(LevelSummary(concurrency=concurrency, run=0, metrics=metrics))
    header = RunHeader(
        url="unknown",
        model=str(model),
        workload=levels[0].metrics.workload,
        concurrency=[lv.concurrency for lv in levels],
        source="guidellm",
        server={"imported_from": str(path)},
    )
    return header, levels, []


def import_aiperf(path: Path) -> tuple[RunHeader, list[LevelSummary], list[RequestRecord]]:
    d = _read(path)
    if not isinstance(d, dict):
        raise CapsimUserError(f"'{path}' does not hold an AIPerf export object")
    records = d.get("records") or d
    if "time_to_first_token" not in records:
        raise CapsimUserError(
            f"'{path}' has no time_to_first_token; is it AIPerf's profile_export_aiperf.json?"
        )

    def stat(name: str, scale: float = 1.0, timed: bool = False) -> Distribution:
        s = records.get(name) or {}
        if not isinstance(s, dict):
            raise ValueError(f"{name} must be an object of statistics, not {s!r:.40}")
        if timed:  # a latency in the unit AIPerf names; 'fortnights' was read as ms
            unit = s.get("unit", "ms")
            if unit not in AIPERF_MS_PER_UNIT:
                raise ValueError(
                    f"{name}.unit {unit!r:.20} is not a time unit AIPerf writes "
                    f"({', '.join(AIPERF_MS_PER_UNIT)})"
                )
            scale *= AIPERF_MS_PER_UNIT[unit]
        return _dist(s.get("avg"), s.get("p50"), s.get("p90"), s.get("p99"), scale, name)

    def scalar(name: str) -> float:
        s = records.get(name) or {}
        return _measure(name, s.get("avg", 0.0) or 0.0)

    config = d.get("input_config") or {}
    concurrency = _whole("loadgen.concurrency", (config.get("loadgen") or {}).get("concurrency"))
    count = _whole("request_count", scalar("request_count"))
    duration = scalar("benchmark_duration")
    if duration <= 0:
        raise ValueError("benchmark_duration must be above 0 seconds: no run takes no time")
    if "concurrency" in (config.get("loadgen") or {}) and concurrency < 1:
        raise ValueError("loadgen.concurrency must be 1 or more")
    metrics = LevelMetrics(
        concurrency=concurrency or None,
        workload="closed" if concurrency else "open",
        requests=count,
        completed=count,
        failed=_whole("error_request_count", scalar("error_request_count")),
        wall_s=duration,
        input_tokens=0,
        output_tokens=0,
        output_tok_s=scalar("output_token_throughput"),
        total_tok_s=0.0,
        prefill_tok_s=0.0,
        request_throughput=scalar("request_throughput"),
        per_request_output_tok_s=stat("output_token_throughput_per_user"),
        ttft_ms=stat("time_to_first_token", timed=True),
        # AIPerf's inter-token latency is (latency - TTFT) / (output - 1): capsim's TPOT
        tpot_ms=stat("inter_token_latency", timed=True),
        itl_ms=_dist(),
        e2e_s=stat("request_latency", 1e-3, timed=True),
        queueing_ms=_dist(),
    )
    names = (config.get("endpoint") or {}).get("model_names") or ["unknown"]
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        # a string was read letter by letter: 'abc' became model 'a'
        raise ValueError(f"endpoint.model_names must be a list of names, not {names!r:.40}")
    model = names[0]
    header = RunHeader(
        url=str((config.get("endpoint") or {}).get("url") or "unknown"),
        model=str(model),
        workload=metrics.workload,
        concurrency=[concurrency] if concurrency else [],
        source="aiperf",
        server={"imported_from": str(path)},
    )
    return header, [LevelSummary(concurrency=concurrency, run=0, metrics=metrics)], []


AIPERF_MS_PER_UNIT = {"ms": 1.0, "s": 1000.0, "us": 1e-3, "ns": 1e-6}
"""Milliseconds in each time unit an AIPerf export names a latency in."""

IMPORTERS = {"vllm-bench": import_vllm_bench, "guidellm": import_guidellm, "aiperf": import_aiperf}


FIELD_ERRORS = (TypeError, ValueError, OverflowError, KeyError, AttributeError)
"""What a field of the wrong type or size raises while a result file is read."""


def unreadable(path: Path, kind: str, exc: Exception) -> CapsimUserError:
    """The user error for a result file whose field raised ``exc`` (FIELD_ERRORS): the
    field and its problem where a record's validation names them, else the exception."""
    if hasattr(exc, "errors"):  # a record's validation: its field and what is wrong
        detail = first_problem(exc)
    else:
        lines = str(exc).splitlines()
        first = lines[0] if lines else ""
        # a ValueError raised here names the field; another is a field of the wrong shape
        detail = first if type(exc) is ValueError else f"a field of the wrong kind ({first})"
    return CapsimUserError(
        f"'{path}' is not a result file of {kind} capsim can read: {detail}"[:300],
        hint="pass the JSON the tool wrote, unedited",
    )


def import_results(kind: str, path: Path, out: Path) -> RunSummary:
    """Convert a result file into a capsim run (``out``: .json summary and .jsonl log)."""
    if kind not in IMPORTERS:
        raise CapsimUserError(f"unknown result format '{kind}'", hint="use " + ", ".join(FORMATS))
    try:
        header, levels, records = IMPORTERS[kind](path)
    except FIELD_ERRORS as exc:  # a field of the wrong type or size: the file is at fault
        raise unreadable(path, kind, exc) from None
    writer = RunWriter(out, header, durable=False)
    concurrency = header.concurrency[0] if header.concurrency else 0
    try:
        for record in records:
            writer.request(record, concurrency, 0)
        # an importer that streams its records gives its levels once they are read
        read = levels() if callable(levels) else levels
        if not any(level.metrics.completed for level in read):
            raise CapsimUserError(
                f"'{path}' holds no completed request: it measured nothing to import",
                hint="pass the result of a run whose requests completed",
            )
        for level in read:
            m = level.metrics
            check_level_means(m.ttft_ms.mean, m.e2e_s.mean, m.wall_s)
            writer.add_level(level)
    except CapsimUserError:
        writer.discard()
        raise
    except FIELD_ERRORS as exc:
        # a bad request deep in the file: what was written of it goes, the run is not half
        # an import
        writer.discard()
        raise unreadable(path, kind, exc) from None
    writer.close(complete=True)
    return writer.summary
