"""capsim's public Python API: what the ``capsim`` command does, as functions with typed
results. The CLI is a thin layer over these.

    import capsim

    result = capsim.predict(gpu="rtx3090", model="qwen3-coder-30b-a3b", concurrency=[1, 4, 16])
    for level in result.levels:
        m = level.metrics
        print(level.level, m.output_tok_s, m.ttft_ms.p50, level.band_80["output_tok_s"])

    answer = capsim.capacity(
        gpu="rtx3090", model="qwen3-coder-30b-a3b", min_agent_tok_s=30, max_ttft_p90_s=2
    )
    print(answer.max_agents, answer.binding)

Units: throughputs in tokens per second, TTFT and TPOT in milliseconds, E2E in seconds,
memory in bytes unless a field's name says otherwise (``*_gb``, ``*_gib``).

Every function takes ``catalog=`` (a Catalog from ``load_catalog``; default: the built-in
one) and raises ``CapsimUserError`` for input it cannot use (an unknown name, a deployment
that does not fit), with a hint.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the imports below are heavy; each function imports what it uses
    from capsim.calibration.compare import ComparedPoint, SkippedScenario
    from capsim.catalog.loader import Catalog
    from capsim.engine.config import PredictConfig
    from capsim.engine.simulate import PredictResult
    from capsim.planner.capacity import CapacityAnswer
    from capsim.planner.search import PlanOutcome, PlanRequest
    from capsim.probe.runfile import RunSummary
    from capsim.probe.runner import ProbeConfig


def load_catalog(extra_dirs: list[Path] | None = None) -> Catalog:
    """The built-in catalog with the user's directories (``extra_dirs``: paths or path
    strings; and ``CAPSIM_DB``) laid over it. An overlay's model entry whose published
    parameter counts lie more than a factor of 2 from those its dimensions give is a
    ``CatalogError`` naming the file and field (capsim/physics/published_counts.py)."""
    from capsim.catalog.loader import load_catalog as load
    from capsim.physics.published_counts import check_published_counts

    catalog = load(extra_dirs)
    check_published_counts(catalog)
    return catalog


def predict(
    config: PredictConfig | None = None,
    /,
    *,
    catalog: Catalog | None = None,
    progress: Callable[[int, int], None] | None = None,
    **fields: Any,
) -> PredictResult:
    """Simulate a deployment at each load level, with prediction bands on every figure.

    Pass a ``PredictConfig`` or its fields as keywords (``gpu``, ``model``, ``quant``,
    ``tp``, ``gpus``, ``concurrency`` (a list of levels), ``input_tokens``,
    ``output_tokens``, ``requests``, ``workload``, ``spec``, ``profile`` ...; a model may be
    a Hugging Face id). The calibration profile ``profile`` names (default ``auto``: the
    one fitted for the GPU's hardware class and engine, the user's own before the shipped
    one) is applied; ``result.profile`` and ``result.profile_path`` say which.
    ``progress(done, total)``, if given, is called as requests are simulated (a few
    thousand at a time, and as each level ends).
    """
    from capsim.arguments import require_callable, require_catalog
    from capsim.calibration.applied import calibrated_predict
    from capsim.engine.config import PredictConfig

    require_catalog(catalog)
    require_callable(progress, "progress")
    config = _merge(PredictConfig, config, fields)
    catalog = catalog or load_catalog()
    _refuse_overrides_nothing_reads(config, catalog)
    return calibrated_predict(config, catalog, progress=progress)


def capacity(
    config: PredictConfig | None = None,
    /,
    *,
    min_agent_tok_s: float | None = None,
    max_ttft_p90_s: float | None = None,
    max_tpot_ms: float | None = None,
    max_e2e_p90_s: float | None = None,
    pessimistic: bool = False,
    catalog: Catalog | None = None,
    **fields: Any,
) -> CapacityAnswer:
    """The largest number of concurrent agents (closed loop, steady state) a deployment
    serves while every given objective holds: per-agent output tok/s at least
    ``min_agent_tok_s``, TTFT p90 at most ``max_ttft_p90_s`` seconds, mean TPOT at most
    ``max_tpot_ms``, E2E p90 at most ``max_e2e_p90_s`` seconds. With ``pessimistic`` each
    must hold at its figure's 80% band's pessimistic edge. The answer names the binding
    constraint and carries the curve around it. Deployment fields as ``predict``'s."""
    from capsim.arguments import require, require_catalog
    from capsim.engine.config import PredictConfig
    from capsim.planner.capacity import Objectives
    from capsim.planner.capacity import capacity as search_capacity

    require_catalog(catalog)
    require(pessimistic, bool, "pessimistic", "True or False")
    objectives = _merge(
        Objectives,
        None,
        {
            "min_agent_tok_s": min_agent_tok_s,
            "max_ttft_p90_s": max_ttft_p90_s,
            "max_tpot_ms": max_tpot_ms,
            "max_e2e_p90_s": max_e2e_p90_s,
        },
    )
    config = _merge(PredictConfig, config, {"workload": "closed", **fields})
    catalog = catalog or load_catalog()
    _refuse_overrides_nothing_reads(config, catalog)
    return search_capacity(config, objectives, catalog, pessimistic=pessimistic)


def plan(
    request: PlanRequest | None = None,
    /,
    *,
    rank: str = "throughput",
    catalog: Catalog | None = None,
    dask_scheduler: str | None = None,
    **fields: Any,
) -> PlanOutcome:
    """Search GPUs, counts, TP/DP splits, formats, KV dtypes and power limits for a number
    of agents (``models``, ``agents``, ``min_agent_tok_s``, ``max_ttft_p90_s``,
    ``budget_usd``, ``gpus``, ``gpu_counts`` ...: a ``PlanRequest`` or its fields), and
    rank what fits (``rank``: throughput, cost or cost-per-token; configurations that meet
    the SLOs first)."""
    from capsim.arguments import require, require_catalog
    from capsim.errors import CapsimUserError
    from capsim.planner.search import PlanRequest, search_plan

    require_catalog(catalog)
    require(rank, str, "rank", "a ranking name: throughput, cost or cost-per-token")
    if dask_scheduler is not None:
        require(dask_scheduler, str, "dask_scheduler", "a scheduler address (a string) or None")
    if request is None:
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
        request = _merge(PlanRequest, None, fields)  # a bad field: CapsimUserError naming it
    elif fields:
        raise CapsimUserError(
            "plan: pass a PlanRequest or its fields, not both",
            hint=f"got a PlanRequest and {', '.join(sorted(fields))}",
        )
    else:
        request = _merge(PlanRequest, request, {}, "request")
    return search_plan(request, catalog or load_catalog(), rank, dask_scheduler)


def validate(
    datasets: list[Path] | None = None,
    *,
    catalog: Catalog | None = None,
    overrides: dict[str, float] | None = None,
    advance: Callable[[], None] | None = None,
) -> tuple[list[ComparedPoint], list[SkippedScenario]]:
    """Compare uncalibrated predictions with published measurements (``datasets``: YAML
    files or folders; default: calibration/published). Returns every compared point
    (measured, predicted, signed relative error) and the scenarios capsim cannot simulate,
    with why. ``overrides`` sets efficiency parameters; ``advance()`` is called after each
    scenario."""
    from capsim.arguments import path_list, require, require_callable, require_catalog
    from capsim.calibration.compare import compare_or_skip
    from capsim.calibration.published import load_published

    require_catalog(catalog)
    require_callable(advance, "advance")
    if overrides is not None:
        require(overrides, dict, "overrides", "a dict of efficiency parameter names to numbers")
        from capsim.errors import CapsimUserError
        from capsim.physics.efficiency import override_problem

        problem = override_problem(overrides)
        if problem is not None:  # a ValueError or ValidationError from the simulation
            raise CapsimUserError(
                f"overrides: {problem[0]}",
                hint='the parameters and their units: capsim explain --json ("efficiency")',
                suggestions=problem[1],
            )
    loaded = load_published(None if datasets is None else path_list(datasets, "datasets"))
    catalog = catalog or load_catalog()
    if overrides:  # a parameter none of the scenarios' models reads, as the CLI refuses it
        from capsim.engine.override_checks import refuse_overrides_no_scenario_reads

        refuse_overrides_no_scenario_reads(overrides, loaded, catalog, "overrides:")
    return compare_or_skip(loaded, catalog, overrides=overrides, advance=advance)


def probe(
    config: ProbeConfig | None = None,
    /,
    *,
    out: Path,
    on_event: Callable[..., None] | None = None,
    **fields: Any,
) -> RunSummary:
    """Measure a running OpenAI-compatible server (``url``, ``model``, ``concurrency``,
    ``input_tokens``, ``output_tokens``, ``runs`` ...: a ``ProbeConfig`` or its fields)
    at each concurrency level, writing ``out`` (.json summary) and its .jsonl log as it
    goes: an interrupted probe keeps every finished request. ``on_event(event, **info)``
    sees levels, requests and warnings."""
    import os

    from capsim.arguments import require, require_callable
    from capsim.probe.runner import ProbeConfig, run_probe

    require_callable(on_event, "on_event")
    require(out, (str, os.PathLike), "out", "a path (str or pathlib.Path) for the run file")
    config = _merge(ProbeConfig, config, fields)
    return run_probe(config, Path(out), on_event)


def _refuse_overrides_nothing_reads(config: PredictConfig, catalog: Catalog) -> None:
    """``efficiency_overrides`` that the deployment would not read (an MoE parameter for a
    dense model, a drafter's cost without ``spec``, a step term its kernels do not use) are
    a CapsimUserError naming the parameter, as the CLI's ``--set`` refuses them (issue 47):
    they changed nothing without a word."""
    from capsim.catalog.resolve import resolve_into
    from capsim.engine.override_checks import (
        refuse_overrides_no_config_reads,
        refuse_overrides_no_model_reads,
        refuse_overrides_no_step_reads,
    )

    overrides = config.efficiency_overrides
    if not overrides:
        return
    model = catalog.models.find(config.model)
    if model is None:  # a Hugging Face id or a config.json path, as the simulation reads it
        catalog, resolved = resolve_into(catalog, [config.model])
        model = catalog.model(resolved[0].name)
        config = config.model_copy(update={"model": model.name})
    given_as = "efficiency_overrides:"
    refuse_overrides_no_model_reads(overrides, [model], given_as)
    refuse_overrides_no_config_reads(overrides, [config], given_as)
    refuse_overrides_no_step_reads(overrides, [config], catalog, given_as)


def _merge(model_type, config, fields: dict, argument: str = "config"):
    """``config`` with ``fields`` laid over (validated), or a new one from ``fields``; a
    ``config`` of another type, or a field ``model_type`` does not have, is refused."""
    import dataclasses

    from pydantic import ValidationError

    from capsim.arguments import described, require
    from capsim.errors import CapsimUserError, close_matches

    name = model_type.__name__
    if config is not None:
        require(config, model_type, argument, f"a {name}, or its fields as keywords")
    if dataclasses.is_dataclass(model_type):  # pydantic models refuse an unknown field
        known = [f.name for f in dataclasses.fields(model_type) if f.init]
        unknown = sorted(set(fields) - set(known))
        if unknown:
            raise CapsimUserError(
                f"{unknown[0]}: not a field of {name}",
                hint=f"see help({name})",
                suggestions=close_matches(unknown[0], known),
            )
    try:
        if config is None:
            return model_type(**fields)
        if not fields:
            return config
        return model_type(**{**config.model_dump(), **fields})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        if first["type"] == "value_error":  # the validator's own line says what it got
            raise CapsimUserError(
                f"{where}: {first['msg'].removeprefix('Value error, ')}",
                hint=f"see help({model_type.__name__})",
            ) from None
        raise CapsimUserError(
            f"{where}: {first['msg']} (got {described(first.get('input'))})",
            hint=f"see help({model_type.__name__})",
        ) from None
