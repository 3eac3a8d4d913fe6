"""Calibration profiles: fitted efficiency parameters for one hardware class and engine.

Profiles ship in calibration/profiles/*.yaml; ``capsim calibrate`` writes the user's own to
the user profile folder (``CAPSIM_PROFILE_DIR``, else the platform's user data folder +
/profiles), never into the package. A prediction finds a profile by hardware class and
engine (``--profile auto``, the default: the user's before the shipped one), or by name or
path.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StrictBool, model_validator

from capsim.calibration.paths import calibration_dir
from capsim.catalog.loader import Catalog, engine_base, load_yaml_text
from capsim.errors import CapsimUserError, close_matches
from capsim.files import write_text_atomic
from capsim.physics.deployment import default_efficiency
from capsim.physics.efficiency import EfficiencyParams

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
"""A float that is a number (no NaN or infinity)."""


MAX_LOG_SD = 10.0
"""Largest log spread a profile may state (its residuals' or a metric family's): a factor of
e^10, about 22,000, either way. A fit that misses by more is not a calibration (capsim
calibrate refuses to write it: ``check_log_spread``); 1e300 overflowed the bands (issue 47's
fourth audit)."""


def check_log_spread(value: float, what: str) -> float:
    """``value`` if it is a log spread a profile may hold, else a user error: the fit
    misses its points by more than a factor of e^MAX_LOG_SD."""
    if not (math.isfinite(value) and 0 <= value <= MAX_LOG_SD):
        raise CapsimUserError(
            f"the fit's {what} is {value:.3g} in log units: its predictions miss the points "
            f"by more than a factor of {math.exp(MAX_LOG_SD):,.0f}, which no calibration "
            "bridges",
            hint="check the dataset's units and metrics (tok/s against s, per request "
            "against per server)",
        )
    return value


LogSpread = Annotated[float, Field(ge=0, le=MAX_LOG_SD, allow_inf_nan=False)]
"""A spread of log(predicted / measured): finite, 0 to MAX_LOG_SD."""


class FittedParameter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: FiniteFloat
    prior: FiniteFloat
    std: float | None = Field(
        None, ge=0, allow_inf_nan=False, description="Standard error from the Jacobian"
    )
    identifiable: StrictBool
    bounds: tuple[FiniteFloat, FiniteFloat]

    @model_validator(mode="after")
    def _ordered_bounds(self) -> FittedParameter:
        low, high = self.bounds
        if low > high:
            raise ValueError(f"bounds {list(self.bounds)} are not in order (low, high)")
        if not low <= self.value <= high:
            raise ValueError(f"value {self.value:g} lies outside its bounds {list(self.bounds)}")
        return self

    at_bound: StrictBool = Field(
        False, description="The fit stopped at a bound (within fit.AT_BOUND of its range)"
    )


class PointResidual(BaseModel):
    """One measured point the fit was scored on: its figure as measured and as predicted
    (the metric's unit: tok/s, s) and the relative error predicted / measured - 1. Each is
    a finite number (a NaN residual was read into a profile's bands as measured)."""

    model_config = ConfigDict(extra="forbid")

    dataset: str
    scenario: str
    concurrency: int = Field(ge=1, le=100_000, description="The load level (as predict's -c)")
    metric: str
    measured: float = Field(gt=0, allow_inf_nan=False)
    predicted: float = Field(ge=0, allow_inf_nan=False)
    error: float = Field(ge=-1, allow_inf_nan=False, description="predicted / measured - 1")
    gpu: str = ""
    engine: str = ""
    statistic: str = "mean"
    scored: StrictBool = True


class Profile(BaseModel):
    """Fitted parameters for one hardware class and engine (calibration/profiles/*.yaml)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    hardware_class: str
    engine: str = "vllm"
    created: str = Field(default_factory=lambda: dt.date.today().isoformat())
    fitted_from: list[str]
    parameters: dict[str, FittedParameter]
    correlation: dict[str, dict[str, FiniteFloat]] = Field(
        default_factory=dict,
        description="Correlation (-1..1) of each pair of fitted parameters' errors, from the "
        "same Jacobian as their standard errors: {name: {other: rho}}, each pair once. "
        "Parameters that trade off (a lower bandwidth efficiency against a higher step "
        "overhead) have a large |rho|; predictions near the fitted points are surer than "
        "either standard error alone says",
    )
    held: dict[str, FiniteFloat] = Field(
        default_factory=dict,
        description="Parameters held at a value for the fit (not fitted), applied with it: "
        "the physics the fitted values assume",
    )
    held_reasons: dict[str, str] = Field(
        default_factory=dict,
        description="Candidates the data could not pin, held at their priors (or at the "
        "value in ``held`` nearest the prior that the data allow), and why",
    )
    log_residual_sd: LogSpread = Field(description="Spread of log(predicted/measured), for bands")
    metric_log_sd: dict[str, LogSpread] = Field(
        default_factory=dict,
        description="The same per metric family (throughput, TTFT, TPOT, E2E)",
    )
    warnings: list[str] = Field(
        default_factory=list, description="Where the fit is poor: metric, levels, bounds"
    )
    cv_log_residual_sd: LogSpread | None = Field(
        None, description="The same, leaving one concurrency level out (cross-validated)"
    )
    points: int = Field(ge=0)
    residuals: list[PointResidual]
    note: str = ""
    _path: str | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        """What a profile states about its parameters agrees with them: each correlation
        is between two of its fitted parameters and within -1..1, each metric family is
        one capsim reports, and every parameter it fits or holds is one capsim has, in
        its range (a file that failed these ran into tracebacks where it was applied)."""
        from capsim.calibration.compare import METRIC_KINDS

        for a, row in self.correlation.items():
            for b, rho in row.items():
                if a not in self.parameters or b not in self.parameters:
                    raise ValueError(
                        f"correlation {a}/{b} names a parameter the profile does not fit"
                    )
                if not (math.isfinite(rho) and -1.0 <= rho <= 1.0):
                    raise ValueError(f"correlation {a}/{b} is {rho!r}; a correlation is -1 to 1")
        families = set(METRIC_KINDS.values())
        unknown = sorted(set(self.metric_log_sd) - families)
        if unknown:
            raise ValueError(f"metric_log_sd names {unknown}; the families are {sorted(families)}")
        check_profile_parameters(self)
        return self

    @property
    def path(self) -> str | None:
        """The file this profile was read from (None if built in memory)."""
        return self._path

    @property
    def band_sd(self) -> float:
        """Log-spread used for prediction bands: the larger of in-sample and CV."""
        return max(self.log_residual_sd, self.cv_log_residual_sd or 0.0)

    def correlation_between(self, a: str, b: str) -> float:
        """The correlation of two fitted parameters' errors (1 for a parameter with
        itself, 0 where the profile holds none)."""
        if a == b:
            return 1.0
        return self.correlation.get(a, {}).get(b, self.correlation.get(b, {}).get(a, 0.0))

    @property
    def fitted_values(self) -> dict[str, float]:
        """The fitted value of each parameter, by name."""
        return {k: p.value for k, p in self.parameters.items()}

    def params(self, catalog: Catalog, gpu_name: str, engine=None) -> EfficiencyParams:
        """The GPU's default parameters (with ``engine``'s priors) with this profile's
        fitted values laid over."""
        base = default_efficiency(catalog.gpu(gpu_name), catalog, engine)
        return base.with_overrides({**self.held, **self.fitted_values})

    def save(self, path: Path) -> Path:
        import yaml

        text = yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)
        return write_text_atomic(path, text)


def check_profile_parameters(profile: Profile) -> None:
    """A profile read from a file fits and holds parameters capsim has, in their ranges (a
    profile naming another failed only when a prediction applied it, with a traceback)."""
    known = set(EfficiencyParams.model_fields) - {"groups"}
    unknown = sorted((set(profile.parameters) | set(profile.held)) - known)
    if unknown:
        raise ValueError(f"unknown efficiency parameter(s) {unknown}")
    EfficiencyParams().with_overrides({**profile.held, **profile.fitted_values})


def load_profile(path: Path) -> Profile:
    """Read and validate a profile YAML. Parsed once per file version (path, size and
    modification time): the planner resolves the same profile for every configuration."""
    from capsim.files import MAX_INPUT_BYTES, read_input_text_checks

    # checked as given, before resolving: /dev/stdin resolved to '/proc/N/fd/pipe:[M]',
    # which the message then said did not exist
    read_input_text_checks(path, "profile", MAX_INPUT_BYTES)
    try:
        stat = path.stat()
        return _load_profile_version(str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    except Exception as exc:
        import yaml  # only here: a prediction that reads a cached profile never loads it
        from pydantic import ValidationError

        from capsim.catalog.loader import format_validation_error

        if isinstance(exc, ValidationError):  # one line: file, field, problem
            raise CapsimUserError(
                f"profile {format_validation_error(path, exc)}",
                hint="a profile is what capsim calibrate writes",
            ) from None
        if isinstance(exc, OSError | ValueError | yaml.YAMLError):  # unreadable, or not one
            raise CapsimUserError(f"cannot read profile '{path}': {exc}") from None
        raise


@functools.lru_cache(maxsize=64)
def _load_profile_version(path: str, mtime_ns: int, size: int) -> Profile:
    """The profile in ``path``, from capsim's cache when this version of the file was
    read before (reading YAML costs importing PyYAML: capsim/catalog/cache.py)."""
    from capsim.catalog.cache import cached_parse

    def parse() -> Profile:
        from capsim.files import read_input_text

        return Profile.model_validate(load_yaml_text(read_input_text(path, "profile")))

    profile = cached_parse("profile", Path(path), [Path(__file__)], Profile, parse)
    profile._path = path
    return profile


PROFILE_DIR_ENV = "CAPSIM_PROFILE_DIR"


def profiles_dir() -> Path:
    """The profiles that ship with capsim (fitted on the published corpus)."""
    return calibration_dir() / "profiles"


def user_profiles_dir() -> Path:
    """Where ``capsim calibrate`` writes profiles by default and ``--profile`` looks first:
    ``CAPSIM_PROFILE_DIR``, else the platform's user data folder + /profiles. As
    CAPSIM_CACHE_DIR: only spaces count as unset, '~' is the home folder, and a relative
    path is ignored with a note ('   ' wrote profiles into a folder named by three spaces
    in the current directory, '~/p' into one named '~')."""
    from capsim.catalog.cache import folder_from_env

    explicit = folder_from_env(PROFILE_DIR_ENV, "the user data folder's profiles are used")
    if explicit is not None:
        return explicit
    import platformdirs

    return Path(platformdirs.user_data_dir("capsim")) / "profiles"


def profile_search_path() -> list[Path]:
    """Folders searched for a profile by name or class, first match wins."""
    return [user_profiles_dir(), profiles_dir()]


def find_profile(spec: str | None, hardware_class: str, engine: str = "vllm") -> Profile | None:
    """Resolve ``--profile``: a path, a name in the profile folders (the user's, then the
    shipped ones), ``auto`` (the profile fitted for the GPU's hardware class under this
    serving engine, if one exists: the user's before the shipped one) or ``none``.
    ``engine`` may name a release ('vllm@0.7.3'): a profile serves the engine's releases
    alike, and one fitted under another engine is refused."""
    if spec in (None, "none"):
        return None
    engine = engine_base(engine)
    if spec == "auto":
        for folder in profile_search_path():
            path = folder / f"{hardware_class}-{engine}.yaml"
            if path.exists():
                return _serving(load_profile(path), hardware_class, engine)
        return None
    from capsim.files import path_exists

    path = Path(spec)
    if not path_exists(path):
        path = next(
            (f / f"{spec}.yaml" for f in profile_search_path() if path_exists(f / f"{spec}.yaml")),
            path,
        )
    if not path_exists(path):
        names = sorted({p.stem for f in profile_search_path() for p in f.glob("*.yaml")})
        raise CapsimUserError(
            f"unknown profile '{spec}' (--profile)",
            hint="known: auto, none, " + ", ".join(names) + ", or a profile file's path",
            suggestions=close_matches(spec, names),
        )
    return _serving(load_profile(path), hardware_class, engine)


def _serving(profile: Profile, hardware_class: str, engine: str) -> Profile:
    """``profile`` if it was fitted on this hardware class under this engine, else a user
    error naming its file (one found by ``--profile auto`` under the class's file name, in
    CAPSIM_PROFILE_DIR, is checked as a named one is)."""
    where = f" ({profile.path})" if profile.path else ""
    if profile.hardware_class != hardware_class:
        raise CapsimUserError(
            f"profile '{profile.name}'{where} was fitted on {profile.hardware_class} "
            f"hardware, not {hardware_class}",
            hint="use a profile of the same hardware class, or --profile none",
        )
    if profile.engine != engine:
        raise CapsimUserError(
            f"profile '{profile.name}'{where} was fitted under {profile.engine}, not {engine} "
            "(--profile, --engine)",
            hint=f"use a profile fitted under {engine} (capsim calibrate on its measurements), "
            "or --profile none",
        )
    return profile
