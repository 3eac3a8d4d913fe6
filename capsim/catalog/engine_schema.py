"""Schemas of a serving engine (hardware_db/engines/: its scheduler defaults, graph capture,
admission reserve, state pool) and of a hardware class's efficiency priors
(hardware_db/efficiency/), each with its source."""

from __future__ import annotations

import re
from typing import Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import Field, StrictBool, field_validator, model_validator

from capsim.catalog.gpu_schema import PLAUSIBLE
from capsim.catalog.schemas import Source, Strict, catalog_key

MAX_ENGINE_COUNT = 2**31
"""Largest count a batch_defaults row gives: capsim.engine.limits.MAX_ENGINE_COUNT, the
flags' limit (the engine layer is above the catalog's, so the figure is repeated here)."""


class EfficiencyProfile(Strict):
    """Default efficiency parameters for one hardware class (hardware_db/efficiency/).

    ``params`` overrides the generic defaults of capsim.physics.efficiency.EfficiencyParams
    for GPUs whose ``hardware_class`` equals ``name``. These are engineering priors, not
    measurements; calibration profiles replace them.
    """

    name: str = catalog_key("The hardware_class these defaults apply to")
    aliases: list[str] = Field(default_factory=list)
    params: dict[str, float] = Field(default_factory=dict)
    fit: list[str] = Field(
        default_factory=list,
        description="Parameters 'capsim calibrate' fits for this class by default "
        "(empty: the generic set)",
    )
    reference_gpu: str | None = Field(
        default=None,
        description="The GPU the class's compute efficiencies were measured on: a GPU of "
        "the class whose tensor rate stands in another ratio to its other units "
        "(vector_fp32_tflops) has them rescaled (physics/tensor_throttle.py); None: "
        "never rescaled",
    )
    rationale: str = Field(description="Why these values: what they were read or derived from")
    sources: list[Source] = Field(min_length=1)


class AdmissionReserve(Strict):
    """Output tokens an engine reserves in its KV pool before admitting a request (SGLang's
    PrefillAdder): every running request holds min(tokens still to generate, clip) x the
    current ratio, a request being admitted its whole min(max_new_tokens, clip); the ratio
    starts at ``init_ratio``, falls by (init - min) / ``decay_steps`` each decode batch to
    ``init_ratio x min_ratio_factor``, and after a retraction (preemption) restarts from
    (generated + ``retract_decode_steps`` x running) / (sum of max_new_tokens + 1), at
    most 1. With ``holds_until_finish`` a request the pool refuses shuts admission until a
    running request finishes or is retracted."""

    init_ratio: float = Field(ge=0, le=1)
    min_ratio_factor: float = Field(gt=0, le=1)
    decay_steps: int = Field(ge=1)
    clip_tokens: int = Field(ge=1, description="CLIP_MAX_NEW_TOKENS: cap on one request's reserve")
    retract_decode_steps: int = Field(ge=0)
    holds_until_finish: StrictBool = Field(
        False,
        description="A refused admission shuts admission until a running request finishes "
        "or is retracted (SGLang's batch_is_full): the ratio's decay alone lets nobody in",
    )


class SlidingWindowPool(Strict):
    """A KV pool of its own for sliding-window layers, sized against the full-attention one
    (SGLang's hybrid SWA memory): the full pool holds ``T`` tokens of every full layer, the
    window pool ``full_tokens_ratio x T`` tokens of every sliding layer, and memory is split so
    that one full-pool token costs the full layers' bytes plus ``full_tokens_ratio`` times
    the sliding layers'. A sequence holds its whole context in the full pool and about its
    window in the window pool, so the full pool bounds the batch. Applies to the model types
    listed (the engine's allow-list); other models keep every layer's tokens in one pool."""

    model_types: list[str] = Field(
        min_length=1, description="config.json model_type values the engine pools this way"
    )
    full_tokens_ratio: float = Field(
        gt=0, le=1, description="Window-pool tokens per full-pool token (SGLang's default 0.8)"
    )
    shared_kv_layers_allocated: StrictBool = Field(
        description="Whether KV-shared layers (Gemma 3n/4) get buffers in the pools although "
        "they read an earlier layer's cache"
    )

    def applies_to(self, model_type: str) -> bool:
        return model_type in self.model_types


class AttentionBackendRule(Strict):
    """Which attention backend an engine picks by itself for a model type (and, where
    given, only on some hardware classes): the first rule that matches applies."""

    model_types: list[str] = Field(
        min_length=1, description="config.json model_type values the rule is for"
    )
    hardware_classes: list[str] | None = Field(
        None, description="Hardware classes the rule is for (None: every class)"
    )
    backend: str = Field(description="The backend's name as the engine's flag spells it")

    def applies_to(self, model_type: str, hardware_class: str) -> bool:
        return model_type in self.model_types and (
            self.hardware_classes is None or hardware_class in self.hardware_classes
        )


class AttentionBackends(Strict):
    """The engine's attention-backend flag (SGLang's and vLLM's --attention-backend): the
    names it takes, which of them run Triton attention kernels (costed with the
    triton_attention_* parameters, physics/attention_backend.py), and the defaults it
    picks per model type. A backend not named here is the engine's own default kernels."""

    flag: str = Field(description="The engine's flag, e.g. --attention-backend")
    names: list[str] = Field(min_length=1, description="Values the flag takes")
    triton: list[str] = Field(
        default_factory=list, description="The values that run Triton attention kernels"
    )
    defaults: list[AttentionBackendRule] = Field(
        default_factory=list,
        description="What the engine picks without the flag, per model type, first match",
    )
    vendors: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Values whose kernels run only on these GPU vendors' GPUs (a CUDA-only "
        "or ROCm-only library); a value not listed runs on any",
    )
    hardware_classes: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Values whose kernels are built for these hardware classes only (an "
        "SM100 or SM90 kernel); a value not listed runs on any of its vendors' classes",
    )
    mla_only: list[str] = Field(
        default_factory=list,
        description="Values for models with multi-head latent attention only",
    )
    not_mla: list[str] = Field(
        default_factory=list,
        description="Values that cannot run multi-head latent attention",
    )

    def default_for(self, model_type: str, hardware_class: str) -> str | None:
        """The backend the engine picks by itself for this model and class (None: its
        default kernels)."""
        for rule in self.defaults:
            if rule.applies_to(model_type, hardware_class):
                return rule.backend
        return None


class StatePool(Strict):
    """Where a hybrid model's fixed-size recurrent state (Gated DeltaNet, Mamba) lives.

    ``shared``: each running sequence's state takes pages of the one KV pool (vLLM's hybrid
    KV-cache manager), so state and attention KV compete for the same bytes. ``split``: the
    engine carves a separate pool of state slots out of the memory left after the weights
    (SGLang's mamba pool: a share ``r / (1 + r)`` with ``r`` its mamba_full_memory_ratio)
    and caps running requests at slots / ``slots_per_sequence`` (with prefix caching the
    engine keeps checkpoint slots beside each request's working one, more of them while its
    overlap scheduler runs a step ahead)."""

    layout: Literal["shared", "split"] = "shared"
    state_share: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="split: share of the memory left after weights and reserves that goes "
        "to the state pool (the rest holds the attention KV)",
    )
    slots_per_sequence: int = Field(
        1,
        ge=1,
        description="split: state slots one running request holds while prefix caching is "
        "on (1 without it), with the engine's overlap (async) scheduler on, its default",
    )
    slots_per_sequence_without_overlap: int | None = Field(
        None,
        ge=1,
        description="split: the same with the overlap scheduler off (None: as with it)",
    )

    @model_validator(mode="after")
    def _share_for_split(self) -> StatePool:
        if self.layout == "split" and self.state_share is None:
            raise ValueError("a split state pool needs state_share")
        return self


class BatchDefaults(Strict):
    """One row of a serving engine's default scheduler limits: it applies to GPUs of at
    least ``min_memory_gb`` that ``except_gpus`` does not name (an engine's rows are read
    in order and the first that applies wins)."""

    min_memory_gb: float = Field(
        0,
        ge=0,
        le=PLAUSIBLE["memory_gb"],  # a row above every GPU's memory is never read
        description="Smallest GPU memory (GB) of the row",
    )
    except_gpus: list[str] = Field(
        default_factory=list, description="GPU catalog names (prefixes) the row skips"
    )
    # the counts are bounded as the flags that set them are (--max-num-seqs ...: 2**31);
    # 1e40 tokens ended in "activations ... 9.5e36 GiB" naming neither file nor field
    max_num_batched_tokens: int = Field(
        ge=1, le=MAX_ENGINE_COUNT, description="Token budget of one step"
    )
    max_num_seqs: int = Field(
        ge=1, le=MAX_ENGINE_COUNT, description="Most sequences scheduled in one step"
    )
    cuda_graph_max_batch: int | None = Field(
        None,
        ge=0,
        le=MAX_ENGINE_COUNT,
        description="Largest batch (sequences) the engine captures a CUDA graph for, where "
        "the engine sizes it by GPU (SGLang's cuda_graph_max_bs); None: the engine's rule",
    )
    cuda_graph_max_batch_tp4: int | None = Field(
        None,
        ge=0,
        le=MAX_ENGINE_COUNT,
        description="The same at tensor-parallel size 4 or more, where it differs",
    )

    def applies_to(self, gpu_name: str, memory_gb: float) -> bool:
        return memory_gb >= self.min_memory_gb and not any(
            gpu_name.startswith(prefix) for prefix in self.except_gpus
        )

    def covers_every_gpu_of(self, other: BatchDefaults) -> bool:
        """Whether this row applies to every GPU ``other`` applies to (a row after it in a
        list would never be read)."""
        return self.min_memory_gb <= other.min_memory_gb and all(
            any(prefix.startswith(skipped) for skipped in other.except_gpus)
            for prefix in self.except_gpus
        )


def check_batch_rows(rows: list[BatchDefaults] | None) -> list[BatchDefaults] | None:
    """An engine's (or a generation's) batch_defaults rows as batch_limits reads them, in
    order, the first that applies winning: each row must be reachable (a row after one
    that applies to every GPU it does was never read: rows out of order, larger memory
    after smaller) and the last must apply to every GPU (a GPU below every row's
    min_memory_gb took the last row's limits anyway). A ValueError names the rows."""
    if not rows:
        return rows
    for j, row in enumerate(rows):
        for i in range(j):
            if rows[i].covers_every_gpu_of(row):
                raise ValueError(
                    f"row {j} (min_memory_gb {row.min_memory_gb:g}) is never used: row {i} "
                    f"(min_memory_gb {rows[i].min_memory_gb:g}) before it applies to every GPU "
                    "it does (the first row that applies wins: list larger memory first)"
                )
    last = rows[-1]
    if last.min_memory_gb or last.except_gpus:
        raise ValueError(
            f"the last row (min_memory_gb {last.min_memory_gb:g}"
            f"{', except_gpus ' + ', '.join(last.except_gpus) if last.except_gpus else ''}) "
            "does not apply to every GPU, and a GPU no row applies to would take it anyway: "
            "end with a row of no min_memory_gb and no except_gpus"
        )
    return rows


GraphCapture = Literal["vllm", "vllm-v0", "sglang", "single-token", "none"]
"""How an engine captures CUDA graphs: vLLM's capture sizes (up to 512 tokens, 1,024 on
datacenter Blackwell), vLLM V0's decode batches (1, 2, 4, then multiples of 8 up to
cuda_graph_max_batch sequences), SGLang's batch sizes (up to cuda_graph_max_bs sequences),
a graph for single-token steps only (llama.cpp), or none."""

OutsideGraphs = Literal["compiled", "eager"]
"""How an engine launches a step no CUDA graph holds: compiled code, or PyTorch operator
by operator (Engine.outside_graphs)."""


class EngineGeneration(Strict):
    """What an engine did differently in a range of its releases (an older scheduler, no
    async scheduling yet, other default limits, slower kernels): the fields it sets replace
    the engine's; ``params`` and ``class_params`` lay over the engine's own. Each cites the
    release notes, code or benchmarks it was read from. Selected by ``--engine NAME@VERSION``
    and by a measurement's engine_version; the engine's own fields describe its newest
    release."""

    versions: str = Field(
        description="The releases it covers, as a PEP 440 specifier set (e.g. '<0.8', "
        "'>=0.8,<0.12'); development builds of a covered release count"
    )
    label: str = Field(description="A few words naming the generation, e.g. 'V0 engine'")
    batch_defaults: list[BatchDefaults] | None = Field(
        None, min_length=1, description="Replaces the engine's rows (None: keeps them)"
    )
    graph_capture: GraphCapture | None = None
    outside_graphs: OutsideGraphs | None = None
    mixes_prefill_and_decode: StrictBool | None = None
    chunked_prefill_above_model_len: int | None = Field(None, ge=1)
    chunks_mla_prefill: StrictBool | None = None
    outputs_a_step_late: StrictBool | None = None
    async_scheduling: StrictBool | None = None
    custom_allreduce: StrictBool | None = None
    flash_attention: StrictBool | None = None
    memory_utilization: float | None = Field(
        None, gt=0, le=1, description="The default share of GPU memory in these releases"
    )
    weight_formats: list[str] | None = Field(
        None,
        min_length=1,
        description="The weight formats these releases load (replaces the engine's list)",
    )
    params: dict[str, float] = Field(default_factory=dict)
    class_params: dict[str, dict[str, float | None]] = Field(
        default_factory=dict,
        description="Parameters laid over one hardware class's for these releases; null "
        "unsets an optional one the engine's own entry sets (a kernel path they lacked)",
    )
    rationale: str = Field(description="What changed, and from which release")
    sources: list[Source] = Field(min_length=1)

    @field_validator("versions")
    @classmethod
    def _specifier(cls, v: str) -> str:
        try:
            spec = SpecifierSet(v)
        except InvalidSpecifier:
            raise ValueError(
                f"'{v}' is not a PEP 440 version range (e.g. '<0.8' or '>=0.8,<0.12')"
            ) from None
        if not len(spec):  # '' holds every release: the newest's own fields were replaced
            raise ValueError(
                f"'{v}' names no range, so it holds every release, the newest too (the "
                "engine's own fields are its newest release's): give the releases that "
                "differed, e.g. '<0.8'"
            )
        if not holds_a_release(spec):
            raise ValueError(
                f"'{v}' holds no release (its bounds exclude each other): the generation "
                "would never apply"
            )
        return v

    @field_validator("batch_defaults")
    @classmethod
    def _rows_in_order(cls, v):
        return check_batch_rows(v)

    def covers(self, version: Version) -> bool:
        """Whether ``version`` (pre-releases and dev builds included) is in this range."""
        return SpecifierSet(self.versions).contains(version, prereleases=True)


def holds_a_release(spec: SpecifierSet) -> bool:
    """Whether some version lies in ``spec``: each version it names is tried, with one
    just above and just below it (a patch, a post and a dev release), and 0 and a version
    above every release."""
    candidates = [Version("0"), Version("99999")]
    for item in spec:
        try:
            named = Version(item.version.removesuffix(".*"))
        except InvalidVersion:  # '===' takes any text
            continue
        release = ".".join(str(n) for n in named.release)
        candidates += [named] + [
            Version(release + suffix) for suffix in (".0.1", ".post1", ".dev0", "a0")
        ]
    return any(spec.contains(v, prereleases=True) for v in candidates)


def formats_hold(patterns: list[str] | None, weight_format: str) -> bool:
    """Whether a list of weight formats (shell patterns over format names, an engine's or a
    generation's ``weight_formats``; None: every format) holds ``weight_format``."""
    import fnmatch

    if patterns is None:
        return True
    return any(fnmatch.fnmatchcase(weight_format, p) for p in patterns)


GENERATION_FIELDS = (
    "batch_defaults",
    "graph_capture",
    "outside_graphs",
    "mixes_prefill_and_decode",
    "chunked_prefill_above_model_len",
    "chunks_mla_prefill",
    "outputs_a_step_late",
    "async_scheduling",
    "custom_allreduce",
    "flash_attention",
    "memory_utilization",
    "weight_formats",
)
"""The Engine fields a generation may replace (params and class_params lay over)."""


class EngineBackend(Strict):
    """A compute backend an engine can be built for (llama.cpp's CUDA, ROCm/HIP, Vulkan,
    SYCL or Metal), with the efficiency parameters it lays over the engine's own: the
    engine's entry describes the backend each vendor's GPUs take by default, and another
    backend is asked for as ``ENGINE:BACKEND`` (``--engine llama.cpp:vulkan``)."""

    label: str = Field(description="A few words naming it, e.g. 'Vulkan'")
    vendors: list[str] = Field(min_length=1, description="GPU vendors it runs on")
    params: dict[str, float] = Field(default_factory=dict)
    class_params: dict[str, dict[str, float | None]] = Field(default_factory=dict)
    rationale: str = Field(description="What differs on it, and from which measurements")
    sources: list[Source] = Field(min_length=1)


def class_params_laid_over(base: dict, extra: dict) -> dict:
    """Per-class parameters ``base`` with ``extra``'s laid over, class by class (a new
    dict; neither argument is changed): how a generation or a backend adds to an
    engine's."""
    merged = {c: dict(v) for c, v in base.items()}
    for c, v in extra.items():
        merged.setdefault(c, {}).update(v)
    return merged


LLAMA_CPP_BUILD = re.compile(r"^b(\d{1,6})(?:\s*\([0-9a-fA-F]{6,40}\))?$")
"""llama.cpp's release tags: a build number, 'b6918', as llama-bench prints it with its
commit, 'b6918 (2f68ce7cf)'."""


def parse_engine_version(text: str) -> Version | None:
    """``text`` as a release number ('0.7.3', 'v0.7.4.dev181+gf35f8e22'; llama.cpp's build
    'b6918' or 'b6918 (2f68ce7cf)' as 6918); None when it is not one (a commit, a
    container tag, 'main', a version of another epoch: no engine numbers its releases
    with one, and '1!0.4' stood above every release, so it was predicted as the newest
    without a word)."""
    text = text.strip()
    build = LLAMA_CPP_BUILD.match(text)
    if build:
        return Version(build.group(1))
    try:
        version = Version(text)
    except ValueError:  # InvalidVersion, or a number past int()'s 4,300 digits
        return None
    return version if version.epoch == 0 else None


class EngineReleases(Strict):
    """The releases an engine's entry was read from: a version outside them is predicted
    with the nearest entry's terms, and capsim says so (Catalog.engine)."""

    oldest: str | None = Field(
        None,
        description="The oldest release the engine's generations describe; older ones "
        "differed in ways not modelled (None: not stated)",
    )
    newest: str = Field(
        description="The newest release the engine's entry was read from or checked against"
    )
    rationale: str = Field(description="Where each bound was read")

    @field_validator("oldest", "newest")
    @classmethod
    def _release(cls, v: str | None) -> str | None:
        if v is not None and parse_engine_version(v) is None:
            raise ValueError(f"'{v}' is not a release number (e.g. '0.7.3', 'b6918')")
        return v

    def outside(self, reference: str, version: Version) -> str | None:
        """A note when ``version`` (as ``reference`` wrote it, e.g. 'vllm@0.99') lies
        outside the releases read, else None. Patch releases of the newest minor count as
        read (0.24.3 when 0.24.0 was)."""
        newest = parse_engine_version(self.newest)
        if newest is not None and _minor(version) > _minor(newest):
            return (
                f"{reference} is newer than {self.newest}, the newest release capsim's "
                "data for this engine were read from: predicted as that release"
            )
        oldest = parse_engine_version(self.oldest) if self.oldest else None
        if oldest is not None and version < oldest:
            return (
                f"{reference} is older than {self.oldest}, the oldest release capsim's "
                "data for this engine describe: predicted as its oldest generation, which "
                "that release may not match"
            )
        return None


def _minor(version: Version) -> tuple[int, ...]:
    """A release's major and minor numbers (a llama.cpp build's single number)."""
    return version.release[:2]


class Engine(Strict):
    """A serving engine (hardware_db/engines/): how it batches, launches and overlaps work.

    ``params`` lays efficiency parameters over the hardware class's for every GPU this
    engine runs on; ``class_params`` lays more over those for one hardware class. Both are
    priors with sources, like the hardware-class files; calibration profiles replace them.
    """

    name: str = catalog_key("Catalog key, e.g. 'vllm', 'llama.cpp'")
    display_name: str
    aliases: list[str] = Field(default_factory=list)
    batch_defaults: list[BatchDefaults] = Field(
        min_length=1, description="Default token budget and sequence limit, by GPU memory"
    )

    @field_validator("batch_defaults")
    @classmethod
    def _rows_in_order(cls, v):
        return check_batch_rows(v)

    graph_capture: GraphCapture = Field(description="Which steps run in a CUDA graph")
    outside_graphs: OutsideGraphs = Field(
        "compiled",
        description="How a step no CUDA graph holds (a prefill chunk, a batch above the "
        "largest graph) launches its kernels: 'compiled', fused code launched from compiled "
        "or native code (vLLM V1's torch.compile'd pieces, llama.cpp's ggml graph; "
        "layer_overhead_compiled_us a layer), or 'eager', PyTorch operator by operator "
        "(layer_overhead_eager_us a layer)",
    )
    weight_formats: list[str] | None = Field(
        None,
        description="The weight formats the engine loads, as shell patterns over capsim's "
        "format names (llama.cpp: gguf-* and the 16-bit formats a GGUF file also holds); "
        "None: every format. A format outside them is refused, and not picked by --quant auto",
    )
    weight_only_formats: list[str] = Field(
        default_factory=list,
        description="Formats whose weights the engine dequantises and multiplies with 16-bit "
        "activations by default even on GPUs with tensor cores for the format (vLLM runs "
        "gpt-oss's MXFP4 experts with BF16 activations): they compute at the 16-bit rate, "
        "as weight-only formats do",
    )
    auto_formats: list[str] | None = Field(
        None,
        description="The formats --quant auto falls back to, in order, when the release "
        "format does not fit; None: capsim's own order (FP8 where native, then AWQ 4-bit)",
    )
    ubatch_tokens: int | None = Field(
        None,
        ge=1,
        description="Physical batch (tokens): a step of more tokens runs as several passes of "
        "at most this many, each reading the weights again (llama.cpp's n_ubatch); None = one",
    )
    mixes_prefill_and_decode: StrictBool = Field(
        True,
        description="Whether a step carries prefill chunks and decodes together (vLLM's and "
        "llama.cpp's chunked prefill); False: prefill batches run apart (SGLang's default)",
    )
    chunked_prefill_above_model_len: int | None = Field(
        None,
        ge=1,
        description="Chunked prefill is on by default only for a max_model_len above this "
        "(vLLM V0: 32768); at or below it prompts are prefilled whole in steps of their own, "
        "prefill first, under a budget of max(max_model_len, 2048) tokens. None: the "
        "engine's batch defaults and mixes_prefill_and_decode hold at every length",
    )
    chunks_mla_prefill: StrictBool = Field(
        True,
        description="Whether chunked prefill applies to models with multi-head latent "
        "attention (DeepSeek-V2/V3/R1) as to others; False: MLA models are prefilled whole "
        "at every max_model_len, as chunked_prefill_above_model_len describes (vLLM V0)",
    )
    disaggregation_handoff: Literal["sequential", "concurrent"] | None = Field(
        None,
        description="How a disaggregated deployment's router hands a request to the decode "
        "instance: 'sequential', once the prefill instance has answered (vLLM's proxy: the "
        "decode server's front end then adds to TTFT), or 'concurrent', to both instances "
        "at once (SGLang's router: the decode server's front end overlaps the prefill). "
        "None: the engine has no disaggregation",
    )
    outputs_a_step_late: StrictBool = Field(
        False,
        description="Whether a step's tokens reach the client only when the next step "
        "ends (vLLM V0's async output processing, on unless --enforce-eager or speculative "
        "decoding turns it off); False: when the step that made them ends",
    )
    async_scheduling: StrictBool = Field(
        description="Whether the engine prepares step n+1 on the CPU while the GPU runs step "
        "n by default (async_host_overlap then applies)"
    )
    async_scheduling_since: str | None = Field(
        None,
        description="The first release with a flag that turns async scheduling on (vLLM's "
        "--async-scheduling, SGLang's overlap scheduler): an older release named with "
        "--engine ENGINE@VERSION refuses --async-scheduling (None: every release has it)",
    )
    custom_allreduce: StrictBool = Field(
        description="Whether tensor-parallel all-reduces can use peer-to-peer custom kernels"
    )
    flash_attention: StrictBool = Field(
        True,
        description="Whether attention runs as fused kernels that keep the query-key scores "
        "on chip by default (FlashAttention, FlashInfer, llama.cpp's -fa); False: the scores "
        "are written to memory as a matrix, soft-maxed and read back (attention_score_bytes)",
    )
    flash_attention_flag: str | None = Field(
        None,
        description="The engine's flag that turns fused attention on or off (llama.cpp's "
        "--flash-attn); None: the engine always runs fused attention kernels",
    )
    memory_utilization: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Share of GPU memory the engine budgets for weights, activations and KV "
        "cache by default (vLLM's gpu_memory_utilization)",
    )
    state_pool: StatePool = Field(
        default_factory=StatePool,
        description="Where hybrid models' recurrent state lives (shared KV pool or a pool "
        "of its own)",
    )
    sliding_window_pool: SlidingWindowPool | None = Field(
        None,
        description="A KV pool apart for sliding-window layers (SGLang's hybrid SWA memory); "
        "None: every layer's tokens in one pool",
    )
    sliding_window_pages: StrictBool = Field(
        False,
        description="Whether a sliding-window layer keeps only its window's pages for a "
        "running sequence (vLLM's hybrid KV cache manager); False: every token's, unless "
        "sliding_window_pool applies",
    )
    admission_reserve: AdmissionReserve | None = Field(
        None,
        description="Decode tokens reserved in the KV pool before admitting a request "
        "(SGLang's new_token_ratio); None: a request is admitted when its prompt fits (vLLM)",
    )
    attention_backends: AttentionBackends | None = Field(
        None,
        description="The engine's attention-backend flag and defaults (None: the engine "
        "has no such flag)",
    )
    params: dict[str, float] = Field(default_factory=dict)
    class_params: dict[str, dict[str, float]] = Field(default_factory=dict)
    generations: list[EngineGeneration] = Field(
        default_factory=list,
        description="Older releases that behaved differently, newest first; the first whose "
        "range holds a version is the one used",
    )
    backends: dict[str, EngineBackend] = Field(
        default_factory=dict,
        description="Compute backends the engine can be built for, by name (ENGINE:NAME); "
        "none: the engine has one per vendor and no choice",
    )
    backend: str | None = Field(
        None, description="The backend this entry describes (None: each vendor's default)"
    )
    releases: EngineReleases | None = Field(
        None, description="The releases the entry was read from (None: not recorded)"
    )
    version: str | None = Field(
        None, description="The release this entry describes (None: the newest)"
    )
    generation: str | None = Field(
        None, description="The label of the older generation laid over it, if any"
    )
    rationale: str = Field(description="Why these values: what they were read or derived from")
    sources: list[Source] = Field(min_length=1)
    notes: str | None = None

    def loads(self, weight_format: str) -> bool:
        """Whether the engine loads checkpoints in ``weight_format`` (a format name)."""
        return formats_hold(self.weight_formats, weight_format)

    def chunks_prefill(self, max_model_len: int, mla: bool = False) -> bool:
        """Whether this engine chunks prompts by default at ``max_model_len`` (tokens) for a
        model with (``mla``) or without multi-head latent attention."""
        if mla and not self.chunks_mla_prefill:
            return False
        limit = self.chunked_prefill_above_model_len
        return limit is None or max_model_len > limit

    def for_model_len(self, max_model_len: int | None, mla: bool = False) -> Engine:
        """This engine's defaults at ``max_model_len`` (tokens; None or 0 where neither the
        flag nor the model tells it: the engine as it is) for a model with (``mla``) or
        without multi-head latent attention: where chunked prefill is off, steps do not mix
        prefills with decodes and the default budget is max(max_model_len, 2048) tokens
        (vLLM V0's SchedulerConfig), the sequence limit and CUDA graphs as the
        batch_defaults row gives them."""
        if not max_model_len or self.chunks_prefill(max_model_len, mla):
            return self
        rows = [
            row.model_copy(update={"max_num_batched_tokens": max(max_model_len, 2048)})
            for row in self.batch_defaults
        ]
        return self.model_copy(update={"batch_defaults": rows, "mixes_prefill_and_decode": False})

    def at_version(self, version: str) -> Engine:
        """This engine as release ``version`` ran it: every generation whose range holds
        it, in the file's order, laid over the newest release's fields (a later one's
        fields replace an earlier one's; their params add up), or the engine itself when
        none does. A narrow range can so add to a wide one (an early kernel stack inside
        the V0 engine's releases). A version that is not a release number is a ValueError
        when the engine has generations to choose from."""
        parsed = parse_engine_version(version)
        example = self.releases.newest if self.releases is not None else "0.7.3"
        builds = LLAMA_CPP_BUILD.match(example) is not None  # llama.cpp counts builds
        build_form = LLAMA_CPP_BUILD.match(version.strip()) is not None
        if parsed is not None and (
            (builds and not (build_form or version.strip().isdigit()))
            or (not builds and build_form)
        ):
            # 'vllm@b6918' read as release 6918 of vLLM, 'llama.cpp@0.7.3' as build 0
            raise ValueError(
                f"'{version}' is not written as {self.name}'s releases are (e.g. "
                f"{self.name}@{example})"
            )
        if parsed is None:
            if self.generations:
                raise ValueError(
                    f"'{version}' is not a release number of {self.name} (e.g. "
                    f"{self.name}@{example}; ranges known: "
                    f"{', '.join(g.versions for g in self.generations)})"
                )
            return self.model_copy(update={"version": version})
        covering = [gen for gen in self.generations if gen.covers(parsed)]
        if not covering:
            return self.model_copy(update={"version": version})
        update: dict = {}
        params = dict(self.params)
        class_params = self.class_params
        for gen in covering:
            update.update(
                {f: getattr(gen, f) for f in GENERATION_FIELDS if getattr(gen, f) is not None}
            )
            params.update(gen.params)
            class_params = class_params_laid_over(class_params, gen.class_params)
        update["params"] = params
        update["class_params"] = class_params
        update["version"] = version
        update["generation"] = " + ".join(gen.label for gen in covering)
        return self.model_copy(update=update)

    def batch_limits(self, gpu_name: str, memory_gb: float) -> BatchDefaults:
        """The first ``batch_defaults`` row that applies to this GPU (the last row when
        none does)."""
        for row in self.batch_defaults:
            if row.applies_to(gpu_name, memory_gb):
                return row
        return self.batch_defaults[-1]

    def on_backend(self, name: str) -> Engine:
        """This engine built for backend ``name``: the backend's params and class_params
        laid over the engine's (a ValueError names the backends there are)."""
        from capsim.errors import close_matches

        key = name.strip().lower()
        if key not in self.backends:
            known = ", ".join(sorted(self.backends)) or "none"
            close = close_matches(key, self.backends, limit=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ValueError(f"unknown backend '{name}'{hint}; {self.name} has: {known}")
        chosen = self.backends[key]
        return self.model_copy(
            update={
                "params": {**self.params, **chosen.params},
                "class_params": class_params_laid_over(self.class_params, chosen.class_params),
                "backend": key,
            }
        )

    def check_backend_runs_on(self, vendor: str) -> None:
        """A CapsimUserError where the chosen backend does not run on a GPU of ``vendor``."""
        if self.backend is None:
            return
        vendors = self.backends[self.backend].vendors
        if vendor not in vendors:
            from capsim.errors import CapsimUserError

            raise CapsimUserError(
                f"{self.name}'s {self.backend} backend does not run on {vendor} GPUs",
                hint=f"it runs on {', '.join(vendors)}; drop ':{self.backend}' for the "
                "GPU's own backend",
            )

    def efficiency_overrides(self, hardware_class: str) -> dict[str, float]:
        """Efficiency parameters this engine sets on a GPU of ``hardware_class``."""
        return {**self.params, **self.class_params.get(hardware_class, {})}
