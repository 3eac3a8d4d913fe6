"""Workloads: how clients send requests to the simulated server.

* ``batch`` (batch rounds): C requests are sent at once; the round ends when the last one
  finishes; then the next round, until ``requests`` (a multiple of C) are done. This is
  seed 002's experiment ("four coding tasks simultaneously", wall clock until all return).
* ``closed`` (closed stream): C requests are always in flight; when one finishes the next
  starts at once, until ``requests`` are done. The semantics of
  ``vllm bench serve --max-concurrency C``, GuideLLM's concurrent mode and AIPerf's
  ``--concurrency``.
* ``agents``: C agents, each a multi-turn conversation of ``turns`` requests. Turn t's
  prompt is turn t-1's prompt plus its output plus ``tool_tokens`` of tool results, so the
  prefix cache can serve everything but the new tokens; agents pause ``think_time``
  seconds between turns. With ``orchestrator``, one orchestrator request runs first, the
  agents fan out after it, and a final orchestrator request gathers their results (seed
  000: one orchestrator plus 49 agents).
* ``open``: ``requests`` arrivals at ``rate`` per second, Poisson or gamma (burstier with
  coefficient of variation above 1), whatever the server's state.
* ``trace``: arrival time, input and output tokens (and optional session) per request from
  a JSONL file.

A seeded numpy Generator draws every length and time, so the same seed gives the same run.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import simpy

from capsim.engine.lengths import LengthSpec, parse_length
from capsim.engine.limits import MAX_CONTEXT_TOKENS
from capsim.engine.progress import Progress
from capsim.engine.request import SimRequest
from capsim.engine.request_log import REQUEST_BUFFER, LoggedRequests, RequestLog
from capsim.engine.router import PROMPTS_REMEMBERED, Router, takes_time
from capsim.errors import CapsimUserError
from capsim.files import loads_json

WorkloadKind = Literal["batch", "closed", "agents", "open", "trace"]
WORKLOADS: tuple[str, ...] = ("batch", "closed", "agents", "open", "trace")


@dataclass(frozen=True)
class TraceEntry:
    arrival: float
    input_tokens: int
    output_tokens: int
    session: str | None = None


def read_trace(path: Path) -> list[TraceEntry]:
    """Read a JSONL trace: one object per line with arrival_time (s), input_tokens,
    output_tokens and optionally session_id."""
    entries = []
    from capsim.files import read_input_text

    lines = read_input_text(path, "trace file", MAX_TRACE_BYTES).splitlines()
    if len(lines) > MAX_TRACE_RECORDS:
        raise CapsimUserError(
            f"trace file '{path}' holds {len(lines):,} lines, more than the "
            f"{MAX_TRACE_RECORDS:,} requests capsim simulates from a trace",
            hint="cut the trace to a window of it (its requests keep their arrival times)",
        )
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = loads_json(line)
            if not isinstance(obj, dict):
                raise TypeError("the line is not a JSON object")
            misspelt = [
                (key, near[0])
                for key in obj
                if key not in TRACE_KEYS
                and (near := difflib.get_close_matches(str(key), TRACE_KEYS, n=1, cutoff=0.8))
            ]
            if misspelt:  # other keys of a public trace (hash_ids, timestamp) are left be
                key, meant = misspelt[0]
                raise ValueError(f"{key!r} is not a trace key (did you mean {meant!r}?)")
            entries.append(
                TraceEntry(
                    trace_number(obj, "arrival_time", 0.0, MAX_TRACE_SECONDS),
                    int(trace_number(obj, "input_tokens", 1, MAX_CONTEXT_TOKENS, whole=True)),
                    int(trace_number(obj, "output_tokens", 1, MAX_CONTEXT_TOKENS, whole=True)),
                    trace_session(obj.get("session_id")),
                )
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError) as exc:
            raise CapsimUserError(
                f"{path}:{number}: not a trace record ({trace_problem(exc)})",
                hint='each line: {"arrival_time": 0.5, "input_tokens": 900, '
                '"output_tokens": 200, "session_id": "a1"}',
            ) from None
    if not entries:
        raise CapsimUserError(f"trace file '{path}' has no records")
    return sorted(entries, key=lambda e: e.arrival)


TRACE_KEYS = ("arrival_time", "input_tokens", "output_tokens", "session_id")
"""The keys of a trace record capsim reads."""

MAX_TRACE_SECONDS = 10 * 365 * 86400.0
"""Latest arrival a trace may give, seconds from its start (ten years: beyond, the
simulator's float clock loses the milliseconds that TTFT is made of)."""


def trace_number(obj: dict, key: str, low: float, high: float, whole: bool = False) -> float:
    """``obj[key]`` as a finite JSON number in [low, high] (an integer where ``whole``);
    strings, booleans and NaN are refused, as the record's fields are numbers."""
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{key} must be a number, got {value!r:.40}")
    if whole and isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{key} must be a whole number of tokens, got {value}")
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits
        number = math.inf
    if not (math.isfinite(number) and low <= number <= high):
        raise ValueError(f"{key} must be between {low:g} and {high:g}, got {value!r:.40}")
    return number


def trace_problem(exc: Exception) -> str:
    """What is wrong with a trace line, in words (no Python exception class names)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON: {exc.msg} at column {exc.colno}"
    if isinstance(exc, KeyError):
        return f"the key {exc.args[0]!r} is missing"
    return str(exc)


def trace_session(value) -> str | None:
    """A record's session_id: a string or number naming the conversation, or none."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TypeError(f"session_id must be a string or a number, got {value!r:.40}")
    if isinstance(value, float) and not math.isfinite(value):  # NaN names no conversation
        raise ValueError(f"session_id must be a string or a finite number, got {value!r}")
    return str(value)


MAX_TRACE_RECORDS = 250_000
"""Most requests a trace file may hold: simulating a trace holds every request, about
2.3 kB each at the peak (621,378 compact records under the byte limit took 1.43 GB), so
this keeps a trace under about 600 MB (issue 47: under 1 GB for any file accepted)."""

MAX_TRACE_BYTES = 32 * 2**20
"""Largest trace file read: about 400,000 requests. Simulating a trace holds its requests,
and 700,000 (a 54 MB file) peaked at 1.01 GB over 7 minutes on the development machine
(issue 47: under 1 GB for any file accepted)."""

GAMMA_CV_RANGE = (0.1, 10.0)
"""Coefficients of variation of gamma inter-arrival times the open workload takes: shape
1/CV^2 from 100 (nearly evenly spaced) to 0.01 (a few huge bursts); beyond, the draws
degenerate in floating point (a CV of 0 divides by zero)."""

MIN_RATE_PER_S = 1e-4
"""Slowest open-loop arrival rate taken (requests per second, one every 2.8 hours): below
it the simulated span runs past float64's microsecond resolution of a step (a rate of
1e-300 put arrivals at 1e300 s, where adding a step changes nothing)."""

MAX_THINK_TIME_S = 1e5
"""Longest agent think time taken (seconds, about 28 hours), for the same reason."""


@dataclass
class Workload:
    """One load level's workload."""

    kind: WorkloadKind = "closed"
    concurrency: int | None = 1
    requests: int = 32
    input: LengthSpec = field(default_factory=lambda: parse_length("1024"))
    output: LengthSpec = field(default_factory=lambda: parse_length("512"))
    rate: float | None = None
    arrival: Literal["poisson", "gamma"] = "poisson"
    gamma_cv: float = 2.0
    turns: int = 4
    think_time: LengthSpec = field(default_factory=lambda: parse_length("0", whole=False))
    tool_tokens: LengthSpec = field(default_factory=lambda: parse_length("256"))
    orchestrator: bool = False
    trace: list[TraceEntry] | None = None

    def validate(self) -> None:
        if self.kind not in WORKLOADS:
            raise CapsimUserError(
                f"unknown workload '{self.kind}'", hint="use one of: " + ", ".join(WORKLOADS)
            )
        needs_concurrency = self.kind in ("batch", "closed", "agents")
        if needs_concurrency and (not self.concurrency or self.concurrency < 1):
            raise CapsimUserError(f"the {self.kind} workload needs a concurrency >= 1")
        if self.kind in ("batch", "closed", "open") and self.requests < 1:
            raise CapsimUserError("--requests must be at least 1")
        if self.kind == "batch" and self.requests % self.concurrency:
            raise CapsimUserError(
                f"--requests {self.requests} is not a multiple of concurrency {self.concurrency}",
                hint="batch rounds send C requests at a time; use a multiple of each level",
            )
        if self.kind == "open" and not (self.rate is not None and 0 < self.rate < math.inf):
            raise CapsimUserError(
                "the open workload needs a finite --rate > 0 (requests per second)"
            )
        if self.kind == "open" and self.rate < MIN_RATE_PER_S:
            raise CapsimUserError(
                f"--rate {self.rate:g} is below {MIN_RATE_PER_S:g} requests a second (one "
                "every 2.8 hours): requests that far apart never share a step",
                hint="predict one request alone with --workload closed --concurrency 1",
            )
        if self.kind == "agents" and self.think_time.maximum > MAX_THINK_TIME_S:
            raise CapsimUserError(
                f"--think-time up to {self.think_time.maximum:g} s is beyond "
                f"{MAX_THINK_TIME_S:g} s (about 28 hours) between an agent's turns",
                hint="give seconds, e.g. --think-time 5 or uniform:2,30",
            )
        if self.kind == "open" and self.arrival == "gamma":
            low, high = GAMMA_CV_RANGE
            if not low <= self.gamma_cv <= high:  # NaN fails too
                raise CapsimUserError(
                    f"--gamma-cv {self.gamma_cv:g} is out of range: give {low:g} to {high:g}",
                    hint="1 is Poisson's burstiness; 2 to 4 are bursty agent swarms",
                )
        if self.kind == "agents" and self.turns < 1:
            raise CapsimUserError("--turns must be at least 1")
        if self.kind == "trace" and not self.trace:
            raise CapsimUserError("the trace workload needs --trace FILE")

    @property
    def max_prompt_tokens(self) -> float:
        """Longest prompt this workload can send (agents grow their context)."""
        if self.kind == "trace":
            return max(e.input_tokens for e in self.trace or [])
        if self.kind == "agents":
            per_turn = self.output.maximum + self.tool_tokens.maximum
            return self.input.maximum + (self.turns - 1) * per_turn
        return self.input.maximum

    @property
    def max_output_tokens(self) -> float:
        if self.kind == "trace":
            return max(e.output_tokens for e in self.trace or [])
        return self.output.maximum


MAX_OPEN_BACKLOG = 200_000
"""Requests an open loop keeps in flight before it stops sending: each waiting request
holds about 0.9 kB (its state, its event, its place in the queues), so 200,000 hold about
180 MB, and an overloaded run of millions of arrivals (--rate 100 against a server that
completes one a second) grew to 3.7 GB. A queue that long means the arrivals outpace the
server by far: latencies grow with the run's length and no steady state exists, which the
prediction says (LevelResult.unsent_requests) instead of simulating more of it."""

DRAW_CHUNK = 2**16
"""Requests whose lengths (and open-loop gaps) are drawn at a time above REQUEST_BUFFER."""


class Draws:
    """Per-request random draws of a workload, read in request order: ``get(i)`` gives
    request ``i``'s (prompt tokens, output tokens, gap s). Up to REQUEST_BUFFER requests
    every draw is made at once from the driver's generator, as always; above it they are
    drawn DRAW_CHUNK at a time from generators spawned from it (one per quantity), so a
    run of any length holds one chunk (a different, equally seeded stream for such runs).
    Reads must not go backwards by more than the current chunk (every driver reads in
    request order)."""

    def __init__(self, w: Workload, rng: np.random.Generator, n: int, gaps=None):
        self.w, self.n, self.gaps = w, n, gaps
        self.start = 0
        if n <= REQUEST_BUFFER:
            self.rngs = None
            self.values = self._draw(rng, rng, rng, n)
        else:
            self.rngs = rng.spawn(3)
            self.values = self._draw(*self.rngs, min(DRAW_CHUNK, n))

    def _draw(self, gap_rng, in_rng, out_rng, size: int):
        gaps = self.gaps(gap_rng, size) if self.gaps is not None else None
        return (self.w.input.tokens(in_rng, size), self.w.output.tokens(out_rng, size), gaps)

    def get(self, i: int) -> tuple[int, int, float | None]:
        while i >= self.start + len(self.values[0]):
            self.start += len(self.values[0])
            self.values = self._draw(*self.rngs, min(DRAW_CHUNK, self.n - self.start))
        j = i - self.start
        prompts, outputs, gaps = self.values
        return prompts[j], outputs[j], None if gaps is None else float(gaps[j])


class Driver:
    """Creates the workload's requests in a SimPy environment and sends them to a router.

    It holds a request only while it is in flight: when one finishes (the replica's
    scheduler calls ``finished``), its figures go to the ``RequestLog`` and the driver
    lets it go."""

    def __init__(
        self,
        env: simpy.Environment,
        router: Router,
        workload: Workload,
        seed: int,
        log: RequestLog,
        agents: list[int] | None = None,
        first_rid: int = 0,
        progress: Progress | None = None,
    ):
        """``agents`` runs only those agents of the agents workload (their turns are the
        same as in the whole workload); request ids start at ``first_rid``; ``progress``
        counts the requests that finish."""
        self.env = env
        self.router = router
        self.w = workload
        self.rng = np.random.default_rng(seed)
        self.log = log
        self.agents = agents
        self.first_rid = first_rid
        self.progress = progress
        self.sent = 0  # requests sent so far
        self.unsent = 0  # an open loop's requests never sent (MAX_OPEN_BACKLOG)
        self.output_tokens_sent = 0  # their output lengths, summed
        self.in_flight: dict[int, SimRequest] = {}  # by request id
        # A client sees a request finish when its last chunk reaches it, the front end's
        # latency after the engine's step (log.frontend), and only then sends its next
        # request: for that long the freed slot stays empty. With no front-end latency a
        # client can send at the very instant the engine finishes a request (closed
        # loops; agents with no think time; an orchestrator gathering).
        self.turnaround = log.frontend
        self.has_turnaround = takes_time(self.turnaround)
        self._turnarounds: dict[int, float] = {}  # turnaround by prompt tokens, as asked
        self.reacts_at_once = (
            workload.kind in ("batch", "closed", "agents") and not self.has_turnaround
        )

    def _send(
        self,
        prompt: int,
        output: int,
        content: object,
        session: str | None = None,
        awaited: bool = True,
    ):
        rid = self.first_rid + self.sent
        req = SimRequest(
            self.env, rid, self.env.now, int(prompt), int(output), content, session, awaited
        )
        self.sent += 1
        self.output_tokens_sent += req.output_len
        self.in_flight[rid] = req
        self.router.submit(req)
        return req

    def finished(self, req: SimRequest) -> None:
        """A request finished: log it and let it go (a closed loop's client then sends
        its next request once it has seen this one end)."""
        del self.in_flight[req.rid]
        self.log.add(req.rid - self.first_rid, req)
        if self.progress is not None:
            self.progress.advance()
        if req.done is None:  # a closed loop's client, a callback rather than a process
            if self.has_turnaround:
                seen = self.env.timeout(self._turnaround_of(req.prompt_len))
            else:  # at this instant, once the step's other finishes are through
                seen = self.env.event()
                seen.succeed()
            seen.callbacks.append(self._closed_send)

    def _turnaround_of(self, prompt_len: int) -> float:
        """``turnaround`` of a prompt of ``prompt_len`` tokens, seconds (remembered)."""
        seconds = self._turnarounds.get(prompt_len)
        if seconds is None:
            if len(self._turnarounds) >= PROMPTS_REMEMBERED:
                self._turnarounds.clear()
            seconds = self._turnarounds[prompt_len] = self.turnaround(float(prompt_len))
        return seconds

    def close(self) -> LoggedRequests:
        """After the simulation: log the requests that never finished, and return what
        the log kept."""
        unfinished = sorted(self.in_flight.items())
        self.in_flight.clear()
        return self.log.close([(rid - self.first_rid, req) for rid, req in unfinished])

    def start(self) -> None:
        kind = self.w.kind
        if kind == "batch":
            self.env.process(self._batch())
        elif kind == "closed":
            n = self.w.requests
            self._closed_draws = Draws(self.w, self.rng, n)
            self._closed_queue = iter(range(n))
            for _ in range(min(self.w.concurrency, n)):
                self._closed_send()
        elif kind == "agents":
            self._draw_agent_turns()
            self.env.process(self._agents())
        elif kind == "open":
            self.env.process(self._open())
        else:
            for entry in self.w.trace or []:
                self.env.process(self._trace_entry(entry))

    def _batch(self):
        c, n = self.w.concurrency, self.w.requests
        draws = Draws(self.w, self.rng, n)
        for start in range(0, n, c):
            batch = [self._send(*draws.get(i)[:2], ("r", i)) for i in range(start, start + c)]
            yield self.env.all_of([r.done for r in batch])
            if self.has_turnaround:  # the round ends when its last client sees its answer
                seen = max(r.finish + self.turnaround(float(r.prompt_len)) for r in batch)
                yield self.env.timeout(max(seen - self.env.now, 0.0))

    def _closed_send(self, _seen=None) -> None:
        """A closed loop's client sends the next request of the level, if any is left
        (``_seen``: the event of its previous request's end reaching it)."""
        i = next(self._closed_queue, None)
        if i is not None:
            self._send(*self._closed_draws.get(i)[:2], ("r", i), awaited=False)

    def requests_left_to_send(self) -> int:
        """A closed loop's requests not yet sent (engine/periodic.py)."""
        return self.w.requests - self.sent

    def skip_ahead(self, requests: int, seconds: float, output_tokens: int) -> None:
        """A closed loop's clients jump ``requests`` sends and ``seconds`` ahead (whole
        periods of a repeating state laid down at once, engine/periodic.py): the
        requests in flight take the ids and times of their counterparts that much later,
        and the next send is ``requests`` further down the queue. ``output_tokens``: the
        skipped requests' output lengths, summed."""
        moved = {}
        for req in self.in_flight.values():
            req.rid += requests
            req.send += seconds
            if req.first_scheduled is not None:
                req.first_scheduled += seconds
            if req.first_token is not None:
                req.first_token += seconds
            moved[req.rid] = req
        self.in_flight = moved
        self.sent += requests
        self.output_tokens_sent += output_tokens
        self._closed_queue = iter(range(self.sent, self.w.requests))

    def _client_sees(self, req: SimRequest):
        """Wait until the client has seen ``req`` finish (the front end's latency)."""
        if self.has_turnaround:
            yield self.env.timeout(self.turnaround(float(req.prompt_len)))

    def _draw_agent_turns(self) -> None:
        """Every agent's turns, drawn up front, so the workload is the same whatever order
        the simulation later runs them in (comparing two deployments compares the same
        conversations)."""
        w = self.w
        c, later = w.concurrency, max(w.turns - 1, 1)
        self._agent_draws = (
            w.input.tokens(self.rng, c),
            w.output.tokens(self.rng, (c, w.turns)),
            w.think_time.seconds(self.rng, (c, later)),
            w.tool_tokens.tokens(self.rng, (c, later)),
        )
        thinks = self._agent_draws[2][:, : w.turns - 1]
        self.reacts_at_once = not self.has_turnaround and (
            w.orchestrator or bool((thinks <= 0).any())
        )

    def _agents(self):
        w = self.w
        if w.orchestrator:
            first = self._send(
                self.w.input.tokens(self.rng, 1)[0],
                w.output.tokens(self.rng, 1)[0],
                ("orchestrator", 0),
                "orchestrator",
            )
            yield first.done
            yield from self._client_sees(first)
        chosen = range(w.concurrency) if self.agents is None else self.agents
        agents = [self.env.process(self._agent(a)) for a in chosen]
        yield self.env.all_of(agents)
        if w.orchestrator:
            # every request's output but the first orchestrator request's
            gathered = self.output_tokens_sent - first.output_len
            final = self._send(
                min(gathered, int(w.input.maximum) * 4),
                w.output.tokens(self.rng, 1)[0],
                ("orchestrator", 1),
                "orchestrator",
            )
            yield final.done

    def _agent(self, agent: int):
        w = self.w
        session = f"agent-{agent}"
        prompts, outputs, thinks, tools = self._agent_draws
        prompt = int(prompts[agent])
        for turn in range(w.turns):
            output = int(outputs[agent, turn])
            req = self._send(prompt, output, ("s", agent), session)
            yield req.done
            if turn + 1 < w.turns:
                yield from self._client_sees(req)
                think = float(thinks[agent, turn])
                if think > 0:
                    yield self.env.timeout(think)
                prompt = prompt + output + int(tools[agent, turn])

    def _open(self):
        w = self.w
        n = w.requests
        if w.arrival == "gamma":
            shape = 1.0 / w.gamma_cv**2

            def gaps(rng, size):
                return rng.gamma(shape, 1.0 / (shape * w.rate), size)
        else:

            def gaps(rng, size):
                return rng.exponential(1.0 / w.rate, size)

        draws = Draws(w, self.rng, n, gaps)
        for i in range(n):
            prompt, output, gap = draws.get(i)
            yield self.env.timeout(gap)
            if len(self.in_flight) >= MAX_OPEN_BACKLOG:
                self.unsent = n - i  # overloaded past doubt: stop before memory runs out
                return
            self._send(prompt, output, ("r", i))

    def _trace_entry(self, entry: TraceEntry):
        yield self.env.timeout(entry.arrival)
        content = ("s", entry.session) if entry.session else ("r", self.sent)
        self._send(entry.input_tokens, entry.output_tokens, content, entry.session)
