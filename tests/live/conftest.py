"""Live tests need CPU vLLM servers that tests/live/run_live.sh starts.

Without them the tests skip with a reason; with CI=true a missing server is a failure,
so CI cannot pass by skipping.
"""

from __future__ import annotations

import os

import pytest


def live_server(kind: str) -> str:
    url = os.environ.get(f"CAPSIM_LIVE_{kind.upper()}_URL")
    if url:
        return url
    reason = (
        f"no live {kind} server: run tests/live/run_live.sh, which starts vLLM's CPU "
        "build on the tiny models and sets CAPSIM_LIVE_*_URL"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)
