"""A disaggregated deployment made ready to simulate: the prefill instances' own Setup and
the KV transfer to the decode replicas (engine/disaggregation.py runs them)."""

from __future__ import annotations

import dataclasses

from capsim.engine.config import PredictConfig
from capsim.errors import CapsimUserError
from capsim.physics.kv_transfer import kv_transfer


def check_disaggregation_flags(config: PredictConfig, engine) -> None:
    """The combinations a disaggregated deployment cannot take, as user errors
    (``engine``: the catalog Engine; one without ``disaggregation_handoff`` has none)."""
    if not config.prefill_replicas:
        given = [
            flag
            for flag, value in (
                ("--prefill-tp", config.prefill_tp),
                ("--kv-transfer-bandwidth", config.kv_transfer_gbs),
            )
            if value is not None
        ]
        if given:
            raise CapsimUserError(
                f"{' and '.join(given)} describe{'s' if len(given) == 1 else ''} "
                "disaggregated prefill instances, and --prefill-replicas is 0",
                hint="add --prefill-replicas N (instances that only prefill)",
            )
        return
    if engine.disaggregation_handoff is None:
        raise CapsimUserError(
            f"--prefill-replicas: {engine.name} has no disaggregated prefill and decode",
            hint="use --engine vllm (--kv-transfer-config) or --engine sglang "
            "(--disaggregation-mode)",
        )
    if config.gpus is not None:
        prefill_gpus = config.prefill_replicas * (config.prefill_tp or config.tp)
        decode_gpus = config.gpus - prefill_gpus
        if decode_gpus < config.tp or decode_gpus % config.tp:
            raise CapsimUserError(
                f"--gpus {config.gpus} leaves {decode_gpus} GPU(s) beside the "
                f"{config.prefill_replicas} prefill instance(s) ({prefill_gpus} GPUs), not "
                f"a whole number of decode replicas of --tp {config.tp}",
                hint=f"--gpus {prefill_gpus + config.tp} or more, in steps of {config.tp}",
            )
    if config.offline:
        raise CapsimUserError(
            "--offline with --prefill-replicas: an in-process engine has no prefill and "
            "decode instances to hand requests between",
            hint="leave one of them out",
        )


def decode_replicas(config: PredictConfig) -> int:
    """The decode replicas of a disaggregated deployment: what --gpus leaves beside the
    prefill instances, over --tp; else --dp (1 without either)."""
    if config.gpus is not None:
        prefill_gpus = config.prefill_replicas * (config.prefill_tp or config.tp)
        return (config.gpus - prefill_gpus) // config.tp
    return config.dp or 1


def open_admission(setup):
    """``setup`` with its admission reserve's hold off (AdmissionReserve.holds_until_finish),
    where it has one."""
    reserve = setup.scheduler.reserve
    if reserve is None or not reserve.holds_until_finish:
        return setup
    opened = reserve.model_copy(update={"holds_until_finish": False})
    return dataclasses.replace(
        setup, scheduler=dataclasses.replace(setup.scheduler, reserve=opened)
    )


def with_prefill_pool(setup, catalog, params=None, profile=None):
    """``setup`` (its decode replicas built) with its prefill instances and KV transfer,
    when ``setup.config.prefill_replicas`` asks for them; ``setup`` itself otherwise."""
    from capsim.engine.setup import build_setup  # the setup module calls this one

    config = setup.config
    if not config.prefill_replicas:
        return setup
    prefill_tp = config.prefill_tp or config.tp
    prefill_config = config.model_copy(
        update={
            "prefill_replicas": 0,
            "prefill_tp": None,
            "kv_transfer_gbs": None,
            "tp": prefill_tp,
            "dp": 1,
            "gpus": None,
            "spec": None,  # a prefill instance makes one token: no drafts to verify
            "kv_capacity_tokens": None,
            "quant": setup.fmt.name,
            "model": setup.model.name,
        }
    )
    try:
        prefill = build_setup(prefill_config, catalog, params, profile)
    except CapsimUserError as error:
        raise CapsimUserError(
            f"the prefill instances (TP {prefill_tp}): {error.message}",
            hint=error.hint,
            suggestions=error.suggestions,
        ) from None
    # SGLang's disaggregated servers never hold admission shut (batch_is_full): the
    # prefill loop resets it every pass (its requests leave when their prompt is done,
    # never through a decode batch that shrinks), and the decode loop admits from its
    # pre-allocation queue, which does not read it (0.5.6 disaggregation/decode.py)
    prefill, setup = open_admission(prefill), open_admission(setup)
    p = setup.step_model.params
    transfer = kv_transfer(
        setup.gpu,
        decode_gpu_bytes=setup.fit.kv_bytes_per_token,
        decode_tp=config.tp,
        prefill_tp=prefill_tp,
        total_gpus=setup.dp * config.tp + config.prefill_replicas * prefill_tp,
        params=p,
        requested_gb_s=config.kv_transfer_gbs,
    )
    handoff = catalog.engine(config.engine).disaggregation_handoff
    return dataclasses.replace(
        setup, prefill=prefill, kv_transfer=transfer, kv_transfer_handoff=handoff
    )
