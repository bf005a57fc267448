"""Live on ZeroGPU, measured under spaces' own emulation (``tests/zerogpu_emulation.py``): one GPU
admission per frame would be one scheduled call per frame, each requesting the app's reservation
for a call and charged at least ZeroGPU's duration factor times it, whatever the frame's work.
That is why the Live tab is a notice on ZeroGPU (docs/LIVE.md has the measured figures)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from zerogpu_emulation import run_scenario

from sapiens2.models.cost import MIN_CALL_S
from sapiens2.zerogpu.quota import DAILY_QUOTA_S, gpu_request

FRAMES = 6


@pytest.fixture(scope="module")
def checkpoints_json(tiny_checkpoints, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("live_zerogpu") / "checkpoints.json"
    path.write_text(json.dumps({t: str(p) for t, p in tiny_checkpoints.items()}))
    return path


@pytest.mark.subprocess
@pytest.mark.parametrize("policy", ["requested", "used"])
def test_one_admission_per_frame_spends_a_visitor_s_quota_in_seconds(
    tmp_path: Path, checkpoints_json: Path, policy: str
) -> None:
    out = run_scenario("live_admission", tmp_path, str(checkpoints_json), policy, str(FRAMES), timeout=600)
    print(json.dumps(out))  # the figures docs/LIVE.md quotes (pytest -s shows them)
    calls = out["calls"]
    assert len(calls) == FRAMES and all(c["approved"] for c in calls)  # one admission per frame
    assert calls[0]["fresh_worker"] and not any(c["fresh_worker"] for c in calls[1:])  # then reused
    assert out["seconds"] >= MIN_CALL_S
    assert all(c["requested_s"] == gpu_request(out["seconds"]).charged_s for c in calls)
    charged = [c["charged_s"] for c in calls]
    assert min(charged[1:]) >= 1  # whole seconds: never less than one a frame
    # at the page's 20 frames a second, one frame's charge a frame empties an anonymous quota within
    # seconds of streaming
    assert DAILY_QUOTA_S["anonymous"] / (20 * min(charged)) < 10
    assert all(w > 0 for w in out["wall_ms"]) and len(out["forward_ms"]) == FRAMES
