"""Predictions with calibration applied: the profile and corpus bands a configuration's
``--profile`` asks for, resolved here (the engine looks neither up) and handed to the
engine's simulation."""

from __future__ import annotations

from capsim.calibration.bands import load_band_table
from capsim.calibration.profiles import Profile, find_profile
from capsim.catalog.loader import Catalog, load_catalog
from capsim.engine.config import PredictConfig
from capsim.engine.setup import build_setup
from capsim.engine.simulate import PredictResult
from capsim.engine.simulate import predict as simulate_predict


def profile_for(config: PredictConfig, catalog: Catalog | None = None) -> Profile | None:
    """The calibration profile ``config.profile`` names for this deployment (``auto``: the
    one for the GPU's hardware class and the engine, the user's before the shipped one;
    ``none``: None)."""
    if config.profile in (None, "none"):
        return None
    cat = catalog or load_catalog()
    return find_profile(config.profile, cat.gpu(config.gpu).hardware_class, config.engine)


def calibrated_predict(
    config: PredictConfig, catalog: Catalog | None = None, **options
) -> PredictResult:
    """``engine.simulate.predict`` with the profile ``config.profile`` names and the
    corpus's uncalibrated bands (``options`` as that function's)."""
    # explicit parameters replace any profile
    profile = None if options.get("params") is not None else profile_for(config, catalog)
    return simulate_predict(
        config, catalog, profile=profile, band_table=load_band_table(), **options
    )


def calibrated_setup(config: PredictConfig, catalog: Catalog | None = None):
    """``engine.setup.build_setup`` with the profile ``config.profile`` names."""
    return build_setup(config, catalog, profile=profile_for(config, catalog))
