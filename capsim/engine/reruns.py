"""A prediction's levels simulated again with some efficiency parameters overridden: the
runs that propagate a calibration profile's parameter uncertainty into its bands
(engine/bands.py, ``propagated_log_sd``).

Each run is one level with PROPAGATION_REQUESTS requests (the same seed as the base run,
so a log change measures the parameter, not sampling noise), without bands. Runs that
``start`` hands to a sweep's worker processes simulate while the sweep's own levels do,
filling the cores the sweep's last levels leave idle; the rest run in this process when
they are asked for.
"""

from __future__ import annotations

from concurrent.futures import Executor, Future

from capsim.engine.bands import PROPAGATION_REQUESTS


def _key(overrides: dict[str, float], index: int) -> tuple:
    return tuple(sorted(overrides.items())), index


class Reruns:
    """Reruns of the levels of ``config`` (a PredictConfig) on ``setup``'s parameters,
    callable as ``reruns(overrides, indices)`` -> one LevelResult per index (indices into
    the prediction's levels, in that order)."""

    def __init__(self, config, catalog, setup):
        from capsim.engine.simulate import sweep_levels

        self.config = config
        self.catalog = catalog
        self.params = setup.step_model.params
        self.levels = sweep_levels(config)
        self._futures: dict[tuple, Future] = {}
        self._done: dict[tuple, object] = {}

    def level_config(self, index: int):
        """The PredictConfig of one rerun: level ``index`` alone, with its requests cut to
        PROPAGATION_REQUESTS (closed loops: at least four rounds of the level)."""
        from capsim.engine.levels import make_workload

        config, level = self.config, self.levels[index]
        update: dict = {}
        if config.workload == "open":
            update = {
                "rates": [level],
                "requests": min(make_workload(config, level).requests, PROPAGATION_REQUESTS),
            }
        elif config.workload in ("closed", "batch", "agents"):
            update = {"concurrency": [int(level)]}
            if config.workload == "closed":
                cap = max(PROPAGATION_REQUESTS, 4 * int(level))
                update["requests"] = min(make_workload(config, level).requests, cap)
        return config.model_copy(update=update)

    def start(self, pool: Executor, moves: list[dict[str, float]], indices: list[int]) -> None:
        """Hand the runs of every move at every index to ``pool``'s workers (``collect``
        them before the pool closes)."""
        from capsim.engine.levels import catalog_dirs

        dirs = catalog_dirs(self.catalog)
        for overrides in moves:
            params = self.params.with_overrides(overrides)
            for i in indices:
                key = _key(overrides, i)
                if key not in self._futures:
                    job = (self.level_config(i), dirs, params)
                    self._futures[key] = pool.submit(_rerun_in_worker, job)

    def collect(self) -> None:
        """Wait for the runs handed to workers (before their pool closes)."""
        for key, future in self._futures.items():
            self._done[key] = future.result()
        self._futures.clear()

    def __call__(self, overrides: dict[str, float], indices: list[int]) -> list:
        from capsim.engine.simulate import predict

        params = self.params.with_overrides(overrides)
        out = []
        for i in indices:
            key = _key(overrides, i)
            if key in self._done:  # run in a worker (start, then collect)
                out.append(self._done.pop(key))
                continue
            sub = self.level_config(i)
            out += predict(
                sub,
                self.catalog,
                params=params,
                workers=1,
                profile_bands=False,
                relative_figures=False,
            ).levels
        return out


def _rerun_in_worker(args):
    """One rerun in a worker process: its level's LevelResult."""
    from capsim.catalog.loader import process_catalog
    from capsim.engine.simulate import predict

    config, dirs, params = args
    catalog = process_catalog(dirs)
    (level,) = predict(
        config, catalog, params=params, workers=1, profile_bands=False, relative_figures=False
    ).levels
    return level
