"""The glibc heap setting: opt-out by environment (every spelling of no), idempotent."""

from __future__ import annotations

import pytest


def test_keep_heap_opt_out_and_idempotent(monkeypatch):
    from mptlml import _heap

    monkeypatch.setenv("MPTLML_KEEP_HEAP", "0")
    assert _heap._set_thresholds() is False
    monkeypatch.delenv("MPTLML_KEEP_HEAP")
    first = _heap.keep_heap()
    assert isinstance(first, bool) and _heap.keep_heap() is first
    assert _heap.heap_kept() is first


@pytest.mark.parametrize("value", ["0", "False", "OFF", "no", " No ", "false"])
def test_keep_heap_opts_out_for_every_no(monkeypatch, value):
    """Every spelling of no opts out (``False`` and ``OFF`` once kept the heap anyway)."""
    from mptlml import _heap

    monkeypatch.setenv("MPTLML_KEEP_HEAP", value)
    assert _heap._set_thresholds() is False


def test_yes_no_settings_are_parsed_in_one_place(monkeypatch):
    """One reading of yes/no for the environment and --set: any case; a third word refused."""
    from mptlml import _heap
    from mptlml._validation import env_flag, parse_flag
    from mptlml.models.hf_loading import hub_offline

    assert [parse_flag(v, "x") for v in ("1", "Yes", " ON", "TRUE")] == [True] * 4
    assert [parse_flag(v, "x") for v in ("0", "No", "off ", "FALSE")] == [False] * 4
    monkeypatch.setenv("MPTLML_KEEP_HEAP", "maybe")
    with pytest.raises(ValueError, match="environment variable MPTLML_KEEP_HEAP must be yes or "
                                         "no .*'maybe'"):
        _heap._set_thresholds()
    monkeypatch.setenv("MPTLML_KEEP_HEAP", "")
    assert env_flag("MPTLML_KEEP_HEAP", True) is True  # empty: the default
    monkeypatch.setenv("HF_HUB_OFFLINE", "On")
    assert hub_offline() is True
