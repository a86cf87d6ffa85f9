"""Scoped settings (GPyTorch style) and the explicit heap opt-in."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import mptlml
from mptlml import _heap, settings
from mptlml.models import PPCA


@pytest.mark.parametrize("setting", [settings.block_elements, settings.mask_bytes,
                                     settings.max_masks])
def test_context_managers_restore_on_exit(setting):
    default = setting.value()
    assert default == setting.default
    with setting(123):
        assert setting.value() == 123
        with setting(7):
            assert setting.value() == 7
        assert setting.value() == 123
    assert setting.value() == default
    with pytest.raises(RuntimeError), setting(5):
        assert setting.value() == 5
        raise RuntimeError("inside")
    assert setting.value() == default
    for bad in (0, -1):
        with pytest.raises(ValueError, match="positive integer"):
            setting(bad)
    with pytest.raises(TypeError):
        setting(2.5)


def test_engine_reads_the_settings():
    model = PPCA.random(6, 2, sigma2=0.3, seed=0)
    x = model.sample(20, generator=0)
    big = mptlml.estimate_lml(model, x, "random-size", num_masks=12, seed=0)
    with settings.block_elements(6 * 20 * 2):  # two masks per model call
        small = mptlml.estimate_lml(model, x, "random-size", num_masks=12, seed=0)
    assert big.num_model_calls == 1 and small.num_model_calls == 6
    with settings.max_masks(10), pytest.raises(ValueError, match="max_masks=10"):
        mptlml.estimate_lml(model, x, "exhaustive")
    assert mptlml.estimate_lml(model, x, "exhaustive").stderr == 0.0


def test_library_never_touches_the_heap(monkeypatch):
    """Estimation and training leave the allocator alone; keep_heap is an explicit opt-in."""
    calls = []
    monkeypatch.setattr(_heap, "_state", {})
    monkeypatch.setattr(_heap, "_set_thresholds", lambda: calls.append(1) or True)
    model = PPCA.random(5, 2, sigma2=0.3, seed=0)
    x = model.sample(4, generator=0)
    mptlml.estimate_lml(model, x, num_masks=2, seed=0)
    mptlml.mpt_curve(model, x, seed=0)
    from mptlml.objectives import MPTLoss

    MPTLoss(model, "random-size")(x, generator=0)
    assert calls == [] and not settings.heap_kept()
    assert settings.keep_heap() is True and settings.keep_heap() is True
    assert calls == [1] and settings.heap_kept()


def _calls_keep_heap(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name == "keep_heap":
                return True
    return False


def test_keep_heap_called_only_by_the_command_line():
    src = Path(mptlml.__file__).parent
    callers = sorted(str(p.relative_to(src)) for p in src.rglob("*.py") if _calls_keep_heap(p))
    assert callers == ["cli/command.py"], callers
