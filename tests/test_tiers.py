"""Tier detection, tier rules and the conftest's skip/mandatory logic."""
import pytest

import conftest
from gemmlab import tiers


def test_capability_to_tier():
    assert tiers._tier_from_capability(9, 0) == "sm90"
    assert tiers._tier_from_capability(10, 0) == "sm100"
    assert tiers._tier_from_capability(8, 0) == "cpu"   # Ampere: no TMA multicast / wgmma
    assert tiers._tier_from_capability(12, 0) == "cpu"  # consumer Blackwell: no tcgen05


@pytest.mark.parametrize("have,need,ok", [
    ("cpu", "gpu", False), ("sm90", "gpu", True), ("sm100", "gpu", True),
    ("sm90", "sm90", True), ("sm100", "sm90", False),   # wgmma is sm_90a-only
    ("sm90", "sm100", False), ("sm100", "sm100", True), ("cpu", "cpu", True),
])
def test_tier_satisfies(have, need, ok):
    assert tiers.tier_satisfies(have, need) is ok


def test_tier_satisfies_rejects_unknown():
    with pytest.raises(ValueError, match="unknown tier"):
        tiers.tier_satisfies("sm90", "sm80")
    with pytest.raises(ValueError, match="unknown machine tier 'gpu'"):
        tiers.tier_satisfies("gpu", "sm90")   # "gpu" is a need, never a machine


def test_require_tier_message_names_call_and_tiers(monkeypatch):
    monkeypatch.setattr(tiers, "detect_tier", lambda: "cpu")
    with pytest.raises(tiers.TierError) as e:
        tiers.require_tier("sm100", "gemmlab.demo")
    msg = str(e.value)
    assert "gemmlab.demo needs tier sm100" in msg and "this machine is tier cpu" in msg
    with pytest.raises(tiers.TierError, match="tier sm90 or sm100"):
        tiers.require_tier("gpu", "gemmlab.demo")
    monkeypatch.setattr(tiers, "detect_tier", lambda: "sm90")
    assert tiers.require_tier("gpu", "x") == "sm90"
    with pytest.raises(tiers.TierError, match="this machine is tier sm90"):
        tiers.require_tier("sm100", "x")


def test_required_tier_env(monkeypatch):
    monkeypatch.delenv(tiers.REQUIRE_ENV, raising=False)
    assert tiers.required_tier() is None
    monkeypatch.setenv(tiers.REQUIRE_ENV, "sm90")
    assert tiers.required_tier() == "sm90"
    monkeypatch.setenv(tiers.REQUIRE_ENV, "h100")
    with pytest.raises(ValueError, match="GEMMLAB_TIER"):
        tiers.required_tier()


def test_needed_tier_prefers_most_demanding():
    assert conftest.needed_tier(["gpu", "sm100"]) == "sm100"
    assert conftest.needed_tier(["gpu"]) == "gpu"
    assert conftest.needed_tier(["nbval-ignore-output"]) is None


class _Item:
    """The parts of a pytest item that pytest_collection_modifyitems reads."""

    def __init__(self, tags):
        self.cell = {"metadata": {"tags": tags}}
        self.marks = []

    def add_marker(self, mark):
        self.marks.append(mark)


def _skipped(item):
    return any(m.name == "skip" for m in item.marks)


@pytest.mark.parametrize("have,declared,tags,skip", [
    ("cpu", None, ["gpu"], True),            # no GPU, nothing declared: skip
    ("cpu", "sm90", ["gpu"], False),         # declared sm90 but absent: mandatory, runs, fails loudly
    ("sm90", None, ["gpu"], False),
    ("sm90", None, ["gpu", "sm100"], True),  # Blackwell cell on Hopper: skip
    ("sm90", "sm90", ["gpu", "sm100"], True),
    ("cpu", None, [], False),                # untagged cells always run
])
def test_collection_skips_and_mandates(monkeypatch, have, declared, tags, skip):
    monkeypatch.setattr(conftest, "detect_tier", lambda: have)
    monkeypatch.setattr(conftest, "required_tier", lambda: declared)
    item = _Item(tags)
    conftest.pytest_collection_modifyitems(None, [item])
    assert _skipped(item) is skip
