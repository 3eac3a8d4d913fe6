"""SGLang's admission reserve (engine/admission.py): hand-worked admissions, the ratio's
schedule, and a decode run that stops where the shrinking reserve first admits."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from capsim.catalog.loader import load_catalog
from capsim.engine.admission import ReserveState
from capsim.engine.config import PredictConfig
from capsim.engine.kv_cache import KVCache
from capsim.engine.request import DECODE, SimRequest
from capsim.engine.scheduler import Scheduler, SchedulerConfig
from capsim.engine.setup import build_setup
from capsim.engine.simulate import predict
from capsim.errors import CapsimUserError

CAT = load_catalog()

SGLANG = CAT.engine("sglang").admission_reserve  # SGLang's defaults (its environ.py)
# the reserve alone, without SGLang's batch_is_full latch (its priority-preemption mode
# reopens admission every pass): the ratio's decay is what lets the head in
REOPENS = SGLANG.model_copy(update={"holds_until_finish": False})


def test_the_ratio_decays_per_decode_batch_to_its_floor_and_restarts_after_a_retraction():
    assert SGLANG.clip_tokens == 4096 and SGLANG.retract_decode_steps == 20
    state = ReserveState(SGLANG)
    assert state.ratio() == 0.7
    state.decode_batches(300)  # halfway: 0.7 - 300 x (0.7 - 0.098) / 600
    assert state.ratio() == pytest.approx(0.7 - 300 * 0.602 / 600)
    state.decode_batches(10_000)
    assert state.ratio() == pytest.approx(0.098)
    # two requests left, 100 and 300 tokens generated of 1,000 each: (400 + 40) / 2,001
    state.retracted(np.array([100.0, 300.0]), np.array([1000.0, 1000.0]))
    assert state.ratio() == pytest.approx(440 / 2001)
    state.decode_batches(1)  # the batch that retracted does not decay it
    assert state.ratio() == pytest.approx(440 / 2001)
    state.decode_batches(1)
    assert state.ratio() == pytest.approx(440 / 2001 - 0.602 / 600)
    state.reset()
    assert state.ratio() == 0.7


def scheduler(reserve, blocks=100, mixes=False):
    return Scheduler(
        SchedulerConfig(
            max_num_seqs=8,
            max_num_batched_tokens=4096,
            mixes_prefill_and_decode=mixes,
            reserve=reserve,
        ),
        KVCache(blocks),
    )


def test_a_request_waits_for_the_reserve_that_vllm_does_not_keep():
    """100 blocks of 16 tokens. a (prompt 160, output 1,000) runs; b (prompt 320, output
    600) needs 320 + 600 = 920 tokens below the free pool less a's hold. After a's prompt
    (10 blocks) 90 blocks, 1,440 tokens, are free and a holds 0.7 x 999 = 699.3:
    920 >= 740.7, so b waits. Without a reserve b is admitted at once."""
    env = simpy.Environment()
    for reserve in (SGLANG, None):
        sched = scheduler(reserve)
        a = SimRequest(env, 0, 0.0, 160, 1000, "a")
        sched.submit(a)
        sched.complete(sched.schedule(0.0), 0.01)
        assert a.phase == DECODE
        b = SimRequest(env, 1, 0.0, 320, 600, "b")
        sched.submit(b)
        step = sched.schedule(0.01)
        if reserve is None:
            assert [p[0] for p in step.prefills] == [b]
        else:
            assert not step.prefills and step.decoding == 1  # a decodes, b waits
            assert sched.head_blocked()


def four_decoding_and_a_head(env, reserve, outputs=(1000, 1000, 1000, 1000), head_out=1400):
    """A scheduler on 300 blocks with four requests decoding (64-token prompts, the given
    outputs) and a fifth (480 + ``head_out`` tokens) waiting on the reserve alone."""
    sched = Scheduler(
        SchedulerConfig(
            max_num_seqs=8,
            max_num_batched_tokens=4096,
            mixes_prefill_and_decode=False,
            reserve=reserve,
        ),
        KVCache(300),
    )
    for i, out in enumerate(outputs):
        sched.submit(SimRequest(env, i, 0.0, 64, out, str(i)))
    sched.complete(sched.schedule(0.0), 0.01)
    head = SimRequest(env, 4, 0.0, 480, head_out, "head")
    sched.submit(head)
    return sched, head


def test_a_decode_run_stops_where_the_reserve_first_admits_the_head():
    """Four requests decode (outputs of 1,000); a fifth waits on the reserve alone. Each
    decode batch takes 4 tokens of the pool, and the reserve falls by about 0.7 x 4 tokens
    plus the ratio's decay on 4,000 tokens to go: without the latch the head gets in a few
    hundred batches on, long before any request finishes. Stepping one batch at a time
    and the scheduler's run length agree on the batch."""
    env = simpy.Environment()
    sched, head = four_decoding_and_a_head(env, REOPENS)
    steps = 0
    while True:
        step = sched.schedule(0.0)
        if step.prefills:
            assert step.prefills[0][0] is head
            break
        assert not sched.complete(step, 0.0)
        steps += 1
    assert 1 < steps < 999
    sched, head = four_decoding_and_a_head(env, REOPENS)
    assert sched.steady_decode(0.0) and sched.head_blocked()
    assert sched.run_length() == steps


def test_sglangs_refused_head_waits_for_a_finish_not_for_the_decay():
    """Five such requests under SGLang's own reserve (holds_until_finish: its
    batch_is_full). The head (480 + 1,340 = 1,820 tokens) is refused at first: 284 free
    blocks (4,544 tokens) less 0.7 x 3,896 tokens to go = 1,816.8. That shuts admission,
    so the head waits while the reserve decays below what it needs (without the latch it
    gets in 11 batches on), and gets in at the batch after the first request finishes
    (output 900: one prefill token and 899 decode batches), when 117 free blocks (1,872
    tokens) less 0.098 x 300 = 29.4 take it. The decode run is that long too (899
    batches from the refused step, not yet applied), and a retraction reopens admission
    as a finish does."""
    assert SGLANG.holds_until_finish
    env = simpy.Environment()
    outputs = (1000, 900, 1000, 1000)
    sched, head = four_decoding_and_a_head(env, SGLANG, outputs, 1340)
    assert not sched.schedule(0.01).prefills  # refused: a decode batch runs instead
    assert sched.admission_shut and sched.head_blocked()
    free_sched, _ = four_decoding_and_a_head(env, REOPENS, outputs, 1340)
    assert free_sched.run_length() == 11  # the decay alone lets it in
    sched, head = four_decoding_and_a_head(env, SGLANG, outputs, 1340)
    steps, finished = 0, []
    while not finished:
        step = sched.schedule(0.0)
        assert not step.prefills
        finished = sched.complete(step, 0.0)
        steps += 1
    assert steps == 899 and [r.output_len for r in finished] == [900]
    assert not sched.admission_shut
    assert [p[0] for p in sched.schedule(0.0).prefills] == [head]
    sched, head = four_decoding_and_a_head(env, SGLANG, outputs, 1340)
    sched.schedule(0.01)  # the refusal
    assert sched.steady_decode(0.0) and sched.run_length() == 899
    sched._preempt(sched.running[-1])  # a retraction reopens it
    assert not sched.admission_shut


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    c=st.integers(3, 10),
    seed=st.integers(0, 10_000),
    kv_blocks=st.integers(150, 500),
    out=st.sampled_from(["uniform:200,800", "lognormal:400,0.5"]),
    mixed=st.booleans(),
)
def test_decode_runs_under_the_reserve_equal_stepping(c, seed, kv_blocks, out, mixed):
    """Long outputs on a small pool keep the queue's head waiting on SGLang's reserve;
    a decode run then ends at the batch where the reserve would first admit it, so the
    fast-forwarded simulation equals the one stepped batch by batch, request by request."""
    config = PredictConfig(
        gpu="rtx3090",
        model="qwen3-coder-30b-a3b",
        quant="awq-int4",
        engine="sglang",
        mixed_chunk=mixed,
        concurrency=[c],
        requests=3 * c,
        input_tokens="uniform:50,400",
        output_tokens=out,
        kv_capacity_tokens=16 * kv_blocks,
        max_num_batched_tokens=512,
        seed=seed,
        profile="none",
    )
    try:
        fast = predict(config, CAT, keep_records=True).levels[0]
    except CapsimUserError:  # a drawn request longer than the KV cache
        assume(False)
    slow = predict(config.model_copy(update={"fast_forward": False}), CAT, keep_records=True)
    slow = slow.levels[0]
    assert fast.steps == slow.steps and fast.preemptions == slow.preemptions
    for x, y in zip(fast.records, slow.records, strict=True):
        assert x.first_token == pytest.approx(y.first_token, rel=1e-9, abs=1e-9)
        assert x.finish == pytest.approx(y.finish, rel=1e-9, abs=1e-9)


def test_schedule_conservativeness_scales_the_reserve_and_is_sglangs_flag():
    """SGLang's --schedule-conservativeness multiplies the starting ratio (0.7 x c, at
    most 1): at 0.5 the request held back above (920 tokens against 1,440 free less
    0.35 x 999 = 349.65: 920 < 1,090.35) gets in; on vLLM the flag is refused."""
    base = dict(gpu="rtx3090", model="qwen3-coder-30b-a3b", quant="awq-int4", profile="none")
    setup = build_setup(PredictConfig(**base, engine="sglang", schedule_conservativeness=0.5))
    assert setup.scheduler.reserve.init_ratio == pytest.approx(0.35)
    assert build_setup(
        PredictConfig(**base, engine="sglang", schedule_conservativeness=3)
    ).scheduler.reserve.init_ratio == pytest.approx(1.0)
    env = simpy.Environment()
    sched = Scheduler(
        SchedulerConfig(
            max_num_seqs=8,
            max_num_batched_tokens=4096,
            mixes_prefill_and_decode=False,
            reserve=setup.scheduler.reserve,
        ),
        KVCache(100),
    )
    a = SimRequest(env, 0, 0.0, 160, 1000, "a")
    sched.submit(a)
    sched.complete(sched.schedule(0.0), 0.01)
    b = SimRequest(env, 1, 0.0, 320, 600, "b")
    sched.submit(b)
    assert [p[0] for p in sched.schedule(0.01).prefills] == [b]
    with pytest.raises(CapsimUserError, match="--schedule-conservativeness is SGLang's flag"):
        build_setup(PredictConfig(**base, schedule_conservativeness=0.5))
