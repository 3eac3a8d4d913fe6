"""The largest workloads capsim simulates (no imports: the CLI checks flags against them
at start-up)."""

MAX_CONCURRENCY = 100_000
"""Highest concurrency (clients in a closed loop, agents of a plan) capsim simulates."""

MAX_GPUS = 16_384
"""The most GPUs one prediction simulates (every data-parallel replica is simulated)."""

MAX_ENGINE_COUNT = 2**31
"""Largest count an engine flag takes (--max-num-seqs, --max-num-batched-tokens,
--max-model-len; an engine's own limits are 32-bit), on the command line and in run files."""

MAX_CONTEXT_TOKENS = 10_000_000
"""The longest prompt or output one request may have, tokens, wherever it is stated (a
length flag or distribution, a trace record, the probe's prompt): the longest context any
served model takes (10M, Llama 4 Scout); a server refuses what its own limit does not."""

MAX_TP = 72
"""The widest tensor-parallel group: the largest NVLink domain (GB200 NVL72)."""

MAX_SEED = 2**64 - 1
"""The largest random seed (--seed, in predict and probe): a 64-bit seed as the engines'
own --seed takes it (torch.manual_seed refuses more); 10**300 was taken and written back
into the results as a 301-digit number."""

MAX_PLAN_CONFIGURATIONS = 100_000
"""The most configurations one plan searches (GPU x count x TP x format x ... x node
count); --top shows at most as many rows (2**64 rows was taken)."""

MAX_BUDGET_USD = 1e12
"""The largest --budget a plan takes, USD (a trillion): above what the dearest searchable
deployment could cost for years; 1e30 was taken as a budget."""

MIN_TIMEOUT_S = 0.001
MAX_TIMEOUT_S = 10_000_000
"""The range of probe's timeouts (--timeout, --connect-timeout, --first-byte-timeout,
--chunk-timeout), seconds: a millisecond, and about four months (10,000,000 tokens at 1
tok/s would take longer); 1e-320 s timed every request out and 1e308 s was taken."""
