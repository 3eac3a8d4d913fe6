"""Efficiency overrides that would change nothing: an MoE or MLA parameter for a model
without routed experts or latent attention, a parameter of a flag the configuration does
not have, a step-time term no step of the configuration reads. The CLI's ``--set`` and the
Python API's ``efficiency_overrides`` refuse them alike (issue 47); ``given_as`` names the one
given in the message."""

from __future__ import annotations

from capsim.errors import CapsimUserError

MOE_ONLY_PARAMS = frozenset(
    {
        "moe_routing_skew",
        "l2_reuse_strength",
        "moe_bandwidth_efficiency",
        "moe_compute_efficiency",
        "moe_compute_efficiency_8bit",
        "moe_gemm_half_width",
        "moe_gemm_half_rows",
        "moe_dequant_compute_efficiency",
        "moe_dequant_bandwidth_efficiency",
        "moe_layer_overhead_us",
        "moe_expert_overhead_us",
        "moe_replaced_ffn_floor_us",
    }
)
"""``--set`` parameters that only routed experts read: a dense model ignores them."""

MLA_ONLY_PARAMS = frozenset(
    {"mla_layer_overhead_us", "mla_layer_floor_share", "layer_overhead_eager_mla_us"}
)
"""``--set`` parameters that only multi-head-latent-attention layers read."""


def refuse_overrides_no_model_reads(
    overrides: dict[str, float], models, given_as: str = "--set"
) -> None:
    """A ``--set`` of an MoE or MLA parameter where none of the models has routed experts
    or latent attention changed nothing and said nothing: refused, naming the parameter
    (``models``: catalog Model objects)."""
    for names, has, what in (
        (MOE_ONLY_PARAMS, lambda m: m.moe is not None, "routed experts (an MoE model)"),
        (MLA_ONLY_PARAMS, lambda m: m.mla is not None, "multi-head latent attention"),
    ):
        given = sorted(set(overrides) & names)
        if given and not any(has(m) for m in models):
            listed = ", ".join(m.name for m in models)
            raise CapsimUserError(
                f"{given_as} {given[0]} applies to models with {what}, and {listed} has none: "
                "it would change nothing",
                hint="leave it out, or pick a model it applies to",
            )


def refuse_overrides_no_scenario_reads(
    overrides: dict[str, float], datasets, cat, given_as: str = "--set"
) -> None:
    """refuse_overrides_no_model_reads for the models of ``datasets``' scenarios (loaded
    published datasets; a scenario of a model the catalog lacks is skipped by validate and
    reads no parameter)."""
    models = []
    for name in sorted({sc.model for ds in datasets for sc in ds.scenarios}):
        try:
            models.append(cat.model(name))
        except CapsimUserError:
            continue
    refuse_overrides_no_model_reads(overrides, models, given_as)


OVERRIDE_GROUPS_NEED = {
    "communication": (
        lambda c: c.tp > 1 or c.pp > 1 or c.expert_parallel or c.dp_attention > 1,
        "GPUs that talk to each other (--tp or --pp above 1, or expert parallelism)",
    ),
    "disaggregation": (lambda c: c.prefill_replicas > 0, "--prefill-replicas"),
    "power": (lambda c: c.power_limit_w is not None, "--power-limit"),
    "speculation": (lambda c: c.spec is not None, "--spec"),
}
"""Parameter groups (EfficiencyParams.groups) that a configuration reads only with some
flag, and the flag, for refuse_overrides_no_config_reads."""


def refuse_overrides_no_config_reads(
    overrides: dict[str, float], configs, given_as: str = "--set"
) -> None:
    """A ``--set`` of a communication, disaggregation, power or speculation parameter that
    none of ``configs`` (PredictConfigs) reads changed nothing and said nothing (an
    all-reduce term at TP 1, a drafter's cost without --spec): refused, naming the flag
    that would make it count."""
    from capsim.physics.efficiency import EfficiencyParams

    groups = EfficiencyParams().groups
    for group, (reads, flag) in OVERRIDE_GROUPS_NEED.items():
        given = sorted(set(overrides) & set(groups.get(group, [])))
        if given and not any(reads(c) for c in configs):
            raise CapsimUserError(
                f"{given_as} {given[0]} is read only with {flag}, which this command does not "
                "have: it would change nothing",
                hint="leave it out, or add the flag it belongs to",
            )


STEP_GROUPS = ("bandwidth", "compute", "overhead", "moe")
"""Parameter groups that act through the step time alone: refuse_overrides_no_step_reads
checks them by computing steps."""


def probe_steps(max_len: int) -> list[tuple[list[int], list[float]]]:
    """Steps that exercise every regime of the step model (decodes at batch 1 to 512 on
    short and long contexts, prefill chunks of 16 to 8,192 tokens with and without earlier
    context, a mixed step), as (new tokens, context) per sequence; contexts within
    ``max_len`` tokens."""
    steps: list[tuple[list[int], list[float]]] = []
    for batch in (1, 8, 64, 512):
        for ctx in (128, 4096, 32768):
            steps.append(([1] * batch, [float(min(ctx, max_len - 1))] * batch))
    for chunk in (16, 512, 8192):
        for ctx in (0, 8192):
            if chunk + ctx <= max_len:
                steps.append(([chunk], [float(ctx)]))
    steps.append(([1] * 32 + [512], [float(min(2048, max_len - 1))] * 32 + [0.0]))
    return steps


def moved_value(params, name: str) -> float:
    """A value of parameter ``name`` other than the one in ``params``, inside the field's
    bounds: half or twice it (a missing or zero value becomes the middle of its range)."""
    field = type(params).model_fields[name]
    low = next((m.ge for m in field.metadata if getattr(m, "ge", None) is not None), None)
    high = next((m.le for m in field.metadata if getattr(m, "le", None) is not None), None)
    value = getattr(params, name)
    if not value:
        lo = 0.0 if low is None else float(low)
        hi = lo + 100.0 if high is None else float(high)
        return (lo + hi) / 2 or 1.0
    for candidate in (value * 0.5, value * 2.0, value * 0.9, value * 1.1):
        inside = (low is None or candidate >= low) and (high is None or candidate <= high)
        if inside and candidate != value:
            return candidate
    return value


def refuse_overrides_no_step_reads(
    overrides: dict[str, float], configs, cat, given_as: str = "--set"
) -> None:
    """A ``--set`` of a step-time parameter that none of ``configs`` reads (an eager launch
    cost without --enforce-eager, a linear-attention term on a model without it, the int8
    GEMM share for a format that never uses it) changed nothing and said nothing (issue 47):
    refused, after checking it numerically, moving the parameter and computing steps of
    every regime (probe_steps) for each configuration; a configuration that cannot be
    built is left to the command to report."""
    import numpy as np

    from capsim.engine.setup import build_setup
    from capsim.physics.efficiency import EfficiencyParams

    groups = EfficiencyParams().groups
    names = sorted(n for g in STEP_GROUPS for n in groups.get(g, []) if n in overrides)
    if not names:
        return
    read: set[str] = set()
    for config in configs:
        base_config = config.model_copy(update={"efficiency_overrides": {}})
        try:
            setup = build_setup(base_config, cat)
        except Exception:  # the command itself reports a bad configuration
            return
        params = setup.step_model.params
        steps = probe_steps(setup.max_model_len)
        base = [setup.step_model.step_time(np.array(n), np.array(c)) for n, c in steps]
        for name in names:
            if name in read:
                continue
            current, own = getattr(params, name), moved_value(params, name)
            # the value given, and one of its own: a term that counts only beyond some
            # threshold (a launch cost above the GPU's time) counts at the value given
            for moved in dict.fromkeys((overrides[name], own)):
                if moved is None or moved == current:
                    continue
                try:
                    other = build_setup(
                        base_config, cat, params=params.with_overrides({name: moved})
                    )
                except Exception:  # the command reports it
                    read.add(name)
                    break
                times = [other.step_model.step_time(np.array(n), np.array(c)) for n, c in steps]
                if any(
                    not np.isclose(a, b, rtol=1e-12, atol=0)
                    for a, b in zip(base, times, strict=True)
                ):
                    read.add(name)
                    break
            else:
                if own == current:
                    read.add(name)  # nothing to move it to: not judged
        if read >= set(names):
            return
    unread = [n for n in names if n not in read]
    raise CapsimUserError(
        f"{given_as} {unread[0]} changes no step of this configuration (its kernels or its "
        "engine do not use it): it would change nothing",
        hint="leave it out, or add the flag, model or format it belongs to "
        "(capsim explain shows the terms a configuration uses)",
    )
