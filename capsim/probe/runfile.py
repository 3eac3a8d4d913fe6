"""Run files: what a probe measured, written as it arrives so nothing is lost.

A run is two files with the same stem:

* ``NAME.jsonl``: one JSON object per line, appended and flushed as events arrive:
  ``{"type": "header", ...}`` first, then ``request`` records (one per finished or failed
  request, with its raw chunk timestamps), ``metrics`` samples scraped from the server,
  and ``level`` markers. An interrupted run keeps every line written before it stopped.
* ``NAME.json``: the summary: the header plus each completed level's aggregates (computed
  by capsim.metrics, the same code the simulator uses). It is rewritten atomically after
  every level, and ``capsim probe summarize NAME.jsonl`` rebuilds it from the JSONL alone.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator

from capsim.engine.limits import MAX_ENGINE_COUNT
from capsim.errors import CapsimUserError
from capsim.files import loads_json
from capsim.metrics import OUTCOMES, LevelMetrics, RequestRecord, legacy_outcome, level_metrics

RUN_FORMAT = "capsim-run/1"

FAILURE_SHARE_LIMIT = 0.05
"""The largest share of a level's requests that may fail for calibration and validation to
use the level without ``--accept-failures``."""


class Deployment(BaseModel):
    """What the user states about the server (the probe cannot see the hardware)."""

    model_config = ConfigDict(extra="forbid")

    gpu: str | None = None
    gpus: int | None = None
    tp: int | None = None
    quant: str | None = None
    kv_dtype: str | None = None
    spec: str | None = Field(
        None, description="Speculative decoding the server runs, as capsim's --spec (mtp:2)"
    )
    engine_flags: dict[str, str] = Field(default_factory=dict)


class RunHeader(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: str = RUN_FORMAT
    started: str = Field(default_factory=lambda: datetime.now(UTC).isoformat())

    @field_validator("format")
    @classmethod
    def _known_format(cls, v: str) -> str:
        """A run file of another format (a later capsim's, or not capsim's) is read only
        when it is this one: its fields may mean other things."""
        if v != RUN_FORMAT:
            raise ValueError(f"format '{v}' is not {RUN_FORMAT}, the run file format capsim reads")
        return v

    capsim_version: str = ""
    url: str
    model: str
    endpoint: str = "completions"
    workload: str = "closed"
    concurrency: list[int] = Field(default_factory=list)
    requests_per_level: int | None = None
    runs: int = 1
    input_tokens: int | None = None
    output_tokens: int | str | None = None
    ignore_eos: StrictBool = True
    deployment: Deployment = Field(default_factory=Deployment)
    server: dict[str, Any] = Field(
        default_factory=dict,
        description="What the server revealed: /v1/models, /props or /get_server_info, "
        "cache config from /metrics",
    )
    source: str = Field("probe", description="probe, or the tool an import came from")


class LevelSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    concurrency: int
    run: int
    metrics: LevelMetrics
    server_deltas: dict[str, float] = Field(
        default_factory=dict, description="Counter increases over the level (from /metrics)"
    )
    server_peaks: dict[str, float] = Field(
        default_factory=dict, description="Largest gauge values sampled during the level"
    )
    errors: dict[str, int] = Field(
        default_factory=dict, description="Failed requests by reason (the error's first part)"
    )
    outcomes: dict[str, int] = Field(
        default_factory=dict,
        description="Requests by outcome (capsim.metrics.OUTCOMES), ok included; empty in "
        "run files written before outcomes were recorded (see level_outcomes)",
    )
    metrics_note: str | None = Field(
        None, description="What went wrong scraping /metrics over the level, if anything"
    )


def failure_reason(error: str) -> str:
    """The kind of a failure, as ``errors`` counts it: its reason up to the first colon
    (``http 500``, ``timeout (between chunks)``, ``malformed stream``)."""
    return error.split(":")[0]


def first_problem(exc: ValueError) -> str:
    """The first problem a record's validation found, as one line (``field: what``)."""
    if hasattr(exc, "errors"):
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        return f"{where}: {message}" if where else message
    return str(exc).splitlines()[0]


def summarize_level(
    records: list[RequestRecord], concurrency: int, run: int, workload: str, **server: Any
) -> LevelSummary:
    """A level's summary from its records: metrics of the ok requests, counts per outcome
    and per failure reason; ``server`` passes LevelSummary's /metrics fields."""
    outcomes = Counter(r.outcome if r.outcome else "failed" for r in records)
    errors = Counter(failure_reason(r.error) for r in records if not r.ok and r.error)
    return LevelSummary(
        concurrency=concurrency,
        run=run,
        errors=dict(errors),
        outcomes={k: outcomes[k] for k in OUTCOMES if outcomes[k]},
        metrics=level_metrics(records, concurrency, workload),
        **server,
    )


COUNTED_ENGINE_FLAGS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len")
"""Engine flags a run records that calibration reads as counts to simulate the server
(by their names with underscores; a run may spell them with dashes)."""


def engine_count(value: object) -> int | None:
    """``value`` (a run file's or a flag's text or number) as a whole number from 1 to
    MAX_ENGINE_COUNT, or None when it is not one ('abc', '1e3', '16.5', [1], 5,000
    digits)."""
    text = str(value).strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 10:
        return None
    number = int(text)
    return number if 1 <= number <= MAX_ENGINE_COUNT else None


def run_outcomes(summary: RunSummary) -> dict[str, int]:
    """Requests by outcome over every level of a run (level_outcomes, summed)."""
    totals: dict[str, int] = {}
    for level in summary.levels:
        for outcome, n in level_outcomes(level).items():
            totals[outcome] = totals.get(outcome, 0) + n
    return totals


def level_outcomes(level: LevelSummary) -> dict[str, int]:
    """Requests by outcome; for a level recorded before outcomes, from its completed count
    and failure reasons (read as legacy_outcome reads a record)."""
    if level.outcomes:
        return dict(level.outcomes)
    out: Counter[str] = Counter()
    if level.metrics.completed:
        out["ok"] = level.metrics.completed
    for reason, n in level.errors.items():
        out[legacy_outcome(reason, None)] += n
    unexplained = level.metrics.failed - sum(level.errors.values())
    if unexplained > 0:
        out["failed"] += unexplained
    return {k: out[k] for k in OUTCOMES if out[k]}


def failure_text(outcomes: dict[str, int]) -> str:
    """``5 http_error, 2 timeout`` (the failures, most first); empty when none."""
    failed = sorted(((n, k) for k, n in outcomes.items() if k != "ok"), key=lambda x: -x[0])
    return ", ".join(f"{n} {k}" for n, k in failed)


def check_failure_share(summary: RunSummary, path: Path, accept: bool = False) -> None:
    """Refuse a run with a level whose failed share exceeds FAILURE_SHARE_LIMIT (its ok
    requests alone may not show the server as it was), unless ``accept``."""
    if accept:
        return
    bad = []
    for lv in summary.levels:
        m = lv.metrics
        if m.requests and m.failed / m.requests > FAILURE_SHARE_LIMIT:
            bad.append(
                f"C={lv.concurrency} run {lv.run}: {m.failed} of {m.requests} failed "
                f"({failure_text(level_outcomes(lv))})"
            )
    if bad:
        raise CapsimUserError(
            f"run '{path}' has levels where more than {FAILURE_SHARE_LIMIT:.0%} of requests "
            f"failed: {'; '.join(bad)}",
            hint="probe again, or pass --accept-failures to use their ok requests anyway",
        )


class RunSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    header: RunHeader
    levels: list[LevelSummary] = Field(default_factory=list)
    complete: StrictBool = False
    stopped: str | None = Field(
        None, max_length=2000, description="Why the run stopped before it finished"
    )


def run_file_paths(out: Path) -> tuple[Path, Path]:
    """The summary (NAME.json) and request log (NAME.jsonl) that ``--out`` names: its
    suffix is replaced where it is a file type (letters only: '.json', '.jsonl', '.yaml'),
    and kept as part of the name where it is not: Path('llama-3.1-8b').suffix is '.1-8b',
    and '--out llama-3.1-8b' wrote llama-3.json, which '--out llama-3.2-1b' then found in
    its way (issue 47, round 6)."""
    if out.suffix[1:].isalpha() and out.suffix[1:].isascii():
        out = out.with_suffix("")
    return out.with_name(out.name + ".json"), out.with_name(out.name + ".jsonl")


class RunWriter:
    """Appends events to NAME.jsonl as they arrive and keeps NAME.json current.

    ``durable`` (a live probe): every event reaches the disk before the next (fsync), so a
    crash or a kill loses no measurement. An import, whose source file is already on disk,
    passes False: the log is synced once when it closes (600,000 per-record fsyncs were
    58 of the 105 s a 37 MB vllm-bench file took)."""

    def __init__(self, out: Path, header: RunHeader, durable: bool = True):
        self.durable = durable
        self.summary_path, self.log_path = run_file_paths(out)
        self.summary_path.parent.mkdir(parents=True, exist_ok=True)
        if self.log_path.is_symlink():  # --force replaces the link, never its target
            self.log_path.unlink()
        self._log = self.log_path.open("w", encoding="utf-8")
        self.summary = RunSummary(header=header)
        self.event({"type": "header", **header.model_dump(mode="json")})
        self.write_summary()

    def event(self, obj: dict[str, Any]) -> None:
        self._log.write(json.dumps(obj, separators=(",", ":")) + "\n")
        if self.durable:
            self._log.flush()
            os.fsync(self._log.fileno())

    def request(self, record: RequestRecord, concurrency: int, run: int) -> None:
        fields = record.model_dump(mode="json")
        if fields.get("chunk_times"):  # to the microsecond: 8-9 characters, not 18-19
            fields["chunk_times"] = [round(t, CHUNK_TIME_DECIMALS) for t in fields["chunk_times"]]
        self.event({"type": "request", "concurrency": concurrency, "run": run, **fields})

    def add_level(self, level: LevelSummary) -> None:
        self.summary.levels.append(level)
        self.event({"type": "level", **level.model_dump(mode="json")})
        self.write_summary()

    def write_summary(self) -> None:
        """NAME.json replaced whole, through a temporary file of its own (a file or a link
        at a fixed NAME.json.tmp was written through and taken)."""
        from capsim.files import write_text_atomic

        write_text_atomic(self.summary_path, self.summary.model_dump_json(indent=2))

    def discard(self) -> None:
        """Close and remove what this writer wrote (an import that failed part-way)."""
        self._log.close()
        self.log_path.unlink(missing_ok=True)
        self.summary_path.unlink(missing_ok=True)

    def close(self, complete: bool, stopped: str | None = None) -> None:
        self.summary.complete = complete
        self.summary.stopped = stopped
        self._log.flush()
        os.fsync(self._log.fileno())
        self._log.close()
        self.write_summary()


CHUNK_TIME_DECIMALS = 6
"""Decimals of the chunk times a run log keeps (seconds from the run's start): a
microsecond, far below the jitter of a streamed token's arrival, so a log of ~10,000
requests of 1,000 tokens stays under MAX_LOG_BYTES; the send, first-token and finish
times keep full precision."""


def iter_events(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete line of a run's JSONL, one at a time (a torn last line from a crash
    is skipped; a long log is never held whole)."""
    for _, event in iter_numbered_events(path):
        yield event


def iter_numbered_events(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``iter_events``, each event with its line number (1 = the first line)."""
    from capsim.files import MAX_LOG_BYTES, iter_input_lines

    for number, line in enumerate(iter_input_lines(path, "run log", MAX_LOG_BYTES), start=1):
        try:
            event = loads_json(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(event, dict):  # was "AttributeError: 'list' object has no ..."
            raise CapsimUserError(
                f"'{path}', line {number}: {type(event).__name__} {str(event)[:40]!r} is not "
                "a JSON object, so not a capsim run log event",
                hint="capsim probe writes it: one JSON object a line",
            )
        yield number, event


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a run's JSONL (iter_events, as a list)."""
    return list(iter_events(path))


def summarize_log(path: Path) -> RunSummary:
    """``rebuild_summary`` of ``path``; a log whose lines hold fields of the wrong type or
    size (hand-edited, or another tool's) is a user error naming it, not a traceback."""
    try:
        return rebuild_summary(path)
    except (TypeError, ValueError, OverflowError, KeyError, AttributeError) as exc:
        if isinstance(exc, CapsimUserError):
            raise
        if hasattr(exc, "errors"):  # a level's or a record's validation: the field and why
            detail = first_problem(exc)
        else:
            detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        raise CapsimUserError(
            f"'{path}' is not a capsim run log: {detail}"[:300],
            hint="capsim probe writes it; lines of other shapes cannot be summarized",
        ) from None


def level_key(event: dict[str, Any], log: Path, line: int) -> tuple[int, int]:
    """A level or request event's (concurrency, run), or a user error naming the line (a
    missing concurrency was "KeyError: 'concurrency'")."""
    try:
        concurrency, run = event["concurrency"], event.get("run", 0)
        if isinstance(concurrency, bool) or isinstance(run, bool):
            raise TypeError
        return int(concurrency), int(run)
    except (KeyError, TypeError, ValueError, OverflowError):
        raise CapsimUserError(
            f"'{log}', line {line}: a {str(event.get('type'))[:20]!r} event needs a whole "
            "number 'concurrency' (and 'run'), and this one has "
            + (f"{str(event['concurrency'])[:40]!r}" if "concurrency" in event else "none"),
            hint="capsim probe writes it; lines of other shapes cannot be summarized",
        ) from None


def rebuild_summary(path: Path) -> RunSummary:
    """Rebuild a run's summary from its JSONL: every level that finished as its ``level``
    event recorded it (what the .json summary holds: the server's counters, and the
    aggregates of an imported run, which has no request records to rebuild them from),
    then every level cut off before it finished, from its request records. The run is
    complete when every level its header planned (each concurrency, each run) finished."""
    first_header: dict[str, Any] | None = None
    groups: dict[tuple[int, int], list[RequestRecord]] = {}
    finished: dict[tuple[int, int], dict[str, Any]] = {}  # each level event, by level
    seen_ids: set[tuple] = set()
    log = path.with_suffix(".jsonl") if path.suffix == ".json" else path  # a .json: its log
    if log != path and path.is_file() and not log.exists():
        raise CapsimUserError(
            f"'{path}' has no run log beside it ('{log.name}' does not exist)",
            hint="capsim probe writes NAME.jsonl beside NAME.json; summarize rebuilds from it",
        )
    for line, e in iter_numbered_events(log):  # one pass, no event kept whole
        if e.get("type") == "header" and first_header is None:
            first_header = e
        if e.get("type") == "level":
            finished[level_key(e, log, line)] = e
        if e.get("type") != "request":
            continue
        key = level_key(e, log, line)
        record = {k: v for k, v in e.items() if k not in ("type", "concurrency", "run")}
        rid = (key, record.get("request_id"))
        if rid[1] is not None and rid in seen_ids:
            raise CapsimUserError(
                f"'{path}': request {rid[1]!r} is recorded twice at concurrency {key[0]} "
                f"(run {key[1]}): a copied line would count it twice",
                hint="each request has one record; remove the copy",
            )
        seen_ids.add(rid)
        try:
            groups.setdefault(key, []).append(RequestRecord.model_validate(record))
        except ValueError as exc:
            raise CapsimUserError(
                f"'{log}', line {line}: request {record.get('request_id')!r} is not a capsim "
                f"record: {first_problem(exc)}"
            ) from None
    if first_header is None:
        raise CapsimUserError(f"'{path}' has no header line; it is not a capsim run log")
    header = RunHeader.model_validate({k: v for k, v in first_header.items() if k != "type"})
    unplanned = sorted({c for c, _ in set(groups) | set(finished)} - set(header.concurrency))
    if header.concurrency and unplanned:  # a level labelled 1e6 showed the C=16 metrics
        raise CapsimUserError(
            f"'{path}' holds requests or levels at concurrency {unplanned[:3]}, which its "
            f"header does not plan ({header.concurrency})",
            hint="capsim probe writes each level's records under the header's levels",
        )
    levels = []
    for c, run in sorted(set(groups) | set(finished)):
        event = finished.get((c, run), {})
        try:
            levels.append(
                LevelSummary.model_validate({k: v for k, v in event.items() if k != "type"})
            )
            continue
        except ValueError:  # no level event, or one of an older format: rebuild the level
            pass
        if (c, run) not in groups:
            continue
        server = {
            k: event[k] for k in ("server_deltas", "server_peaks", "metrics_note") if k in event
        }
        levels.append(summarize_level(groups[(c, run)], c, run, header.workload, **server))
    planned = {(c, run) for c in header.concurrency for run in range(header.runs)}
    complete = bool(finished) and (planned or set(groups)) <= set(finished)
    return RunSummary(header=header, levels=levels, complete=complete)


def load_run(path: Path, events: bool = True) -> tuple[RunSummary, list[dict[str, Any]]]:
    """A run's summary (rebuilt from the log if the summary is missing) and its events
    (none read when ``events`` is False: a caller that needs only the summary)."""
    summary_path = path.with_suffix(".json")
    log_path = path.with_suffix(".jsonl")
    if summary_path.exists():
        from capsim.files import json_containers_over_limit, read_input_text

        text = read_input_text(summary_path, "run summary")
        too_many = json_containers_over_limit(text)
        if too_many:
            raise CapsimUserError(f"run summary '{summary_path}' {too_many}")
        try:
            summary = RunSummary.model_validate_json(text)
        except ValidationError as exc:
            from capsim.catalog.loader import format_validation_error

            raise CapsimUserError(
                format_validation_error(summary_path, exc).replace(
                    "invalid entry", "not a capsim run summary"
                )
            ) from None
    elif log_path.exists():
        summary = summarize_log(log_path)
    else:
        raise CapsimUserError(f"run '{path}' not found (looked for .json and .jsonl)")
    return summary, read_events(log_path) if events and log_path.exists() else []
