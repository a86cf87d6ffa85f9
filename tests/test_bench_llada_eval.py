"""The benchmark against LLaDA's scheme (``benchmarks/bench_llada_eval.py``): its smoke mode runs.

A model of LLaDA's architecture trained for seconds, one local multiple-choice task
through lm-eval with ``mptlml``'s defaults and with LLaDA's scheme: the JSON it writes
holds both schemes, LLaDA's fixed budget spent exactly (mc_num masks per candidate).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mptlml

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_llada_eval.py"


@pytest.mark.slow
def test_smoke_mode_runs_and_reports_both_schemes(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(mptlml.__file__).resolve().parents[1]),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = tmp_path / "smoke.json"
    p = subprocess.run([sys.executable, str(BENCH), "--smoke", "--out", str(out)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    res = json.loads(out.read_text())
    assert res["training"]["steps"] > 0 and res["questions"] == 6
    (mpt, llada) = res["schemes"].values()
    assert llada["masked_inputs_per_question"] == 4 * 32  # mc_num per candidate, exactly
    assert mpt["masked_inputs_per_question"] > 0 and mpt["forward_calls"] > 0
    for r in (mpt, llada):
        assert 0 <= r["agree_exhaustive"] <= 1 and r["seconds"] > 0
    assert "| scheme |" in p.stdout
