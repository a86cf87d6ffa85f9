"""The glibc heap setting: opt-out by environment, idempotent."""

from __future__ import annotations


def test_keep_heap_opt_out_and_idempotent(monkeypatch):
    from mptlml import _heap

    monkeypatch.setenv("MPTLML_KEEP_HEAP", "0")
    assert _heap._set_thresholds() is False
    monkeypatch.delenv("MPTLML_KEEP_HEAP")
    first = _heap.keep_heap()
    assert isinstance(first, bool) and _heap.keep_heap() is first
    assert _heap.heap_kept() is first
