"""Devices, dtypes, loading kwargs, data parallel (CPU, gloo) and data through ``datasets``.

No GPU is assumed: CUDA paths are exercised by their refusals; the CPU runs
through the same code (autocast in bfloat16 included).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import mptlml
from mptlml import mpt_curve
from mptlml._scoring import distributed
from mptlml.cli import main
from mptlml.data import load_texts
from mptlml.models import MaskedLM

from .mlm_helpers import SENTENCES


@pytest.fixture(scope="module")
def bare_dir(tiny, tmp_path_factory):
    """The tiny model saved without its tokenizer (AntiBERTy's layout)."""
    d = tmp_path_factory.mktemp("bare")
    tiny.model.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def texts_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "texts.txt"
    p.write_text("\n".join(SENTENCES * 2) + "\n")
    return p


# ---------------------------------------------------------------------- loading
def test_from_pretrained_dtype_and_tokenizer(bare_dir, tiny):
    lm = MaskedLM.from_pretrained(bare_dir, tokenizer=tiny.tokenizer, dtype=torch.float64)
    assert lm.dtype == torch.float64 and lm.model.dtype == torch.float64
    assert all(p.dtype == torch.float64 for p in lm.parameters())
    assert lm.placement() == {"device": "cpu", "dtype": "float64", "autocast": None}
    ref = mptlml.pll(tiny, SENTENCES)
    got = mptlml.pll(lm, SENTENCES)
    assert not torch.equal(got, ref)  # float64 end to end (log-softmax too) ...
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-4)  # ... and the same model
    old = MaskedLM.from_pretrained(bare_dir, tokenizer=tiny.tokenizer, torch_dtype="bfloat16")
    assert old.dtype == torch.bfloat16  # transformers' older name
    with pytest.raises(ValueError, match="disagree"):
        MaskedLM.from_pretrained(bare_dir, tokenizer=tiny.tokenizer, dtype="float32",
                                 torch_dtype="float16")
    with pytest.raises(ValueError, match="unknown dtype"):
        MaskedLM.from_pretrained(bare_dir, tokenizer=tiny.tokenizer, dtype="float8")


def test_hf_kwargs_reach_transformers(tiny_dir, monkeypatch):
    import transformers

    seen = {}
    for cls in (transformers.AutoModelForMaskedLM, transformers.AutoTokenizer):
        orig = cls.from_pretrained.__func__

        def spy(klass, src, *a, _orig=orig, _name=cls.__name__, **kw):
            seen[_name] = dict(kw)
            return _orig(klass, src, *a, **kw)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    lm = MaskedLM.from_pretrained(tiny_dir, revision="main", trust_remote_code=False,
                                  attn_implementation="eager", device_map="cpu",
                                  local_files_only=True, dtype="float64")
    model_kw, tok_kw = seen["AutoModelForMaskedLM"], seen["AutoTokenizer"]
    assert model_kw["revision"] == "main" and model_kw["trust_remote_code"] is False
    assert model_kw["attn_implementation"] == "eager" and model_kw["device_map"] == "cpu"
    assert model_kw["local_files_only"] is True and model_kw["dtype"] == torch.float64
    assert tok_kw["revision"] == "main" and "device_map" not in tok_kw
    assert "attn_implementation" not in tok_kw
    assert lm.model.config._attn_implementation == "eager" and lm.dtype == torch.float64
    with pytest.raises(ValueError, match="device= or device_map="):
        MaskedLM.from_pretrained(tiny_dir, device="cpu", device_map="cpu")
    with pytest.raises(TypeError, match="do not apply with random_init"):
        MaskedLM.from_pretrained(tiny_dir, random_init=True, device_map="cpu")


def test_to_device_and_dtype_properties(tiny_dir):
    lm = MaskedLM.from_pretrained(tiny_dir, device="cpu")
    assert lm.device == torch.device("cpu") and lm.dtype == torch.float32
    assert lm.to("cpu") is lm
    assert lm.to(torch.float64).dtype == torch.float64
    assert lm.fingerprint()["dtype"] == "float64"


def test_autocast_is_explicit_and_recorded(tiny_dir, tiny):
    assert tiny.autocast_dtype is None  # off unless asked
    lm = MaskedLM.from_pretrained(tiny_dir, autocast=True)
    assert lm.placement()["autocast"] == "bfloat16"  # CPU autocast
    assert lm.fingerprint()["autocast"] == "bfloat16"
    got, ref = mptlml.pll(lm, SENTENCES), mptlml.pll(tiny, SENTENCES)
    assert not torch.equal(got, ref)
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=0.05)
    with pytest.raises(ValueError, match="autocast must be"):
        MaskedLM.from_pretrained(tiny_dir, autocast="float64")


def test_batch_size_bounds_the_forward_passes(tiny):
    kw = dict(rates=[0.2, 0.5, 0.8], num_masks=2, seed=1)
    ref = mpt_curve(tiny, SENTENCES, **kw)
    one = mpt_curve(tiny, SENTENCES, batch_size=1, **kw)
    assert one.num_model_calls == len(SENTENCES) * 3 * 2 > ref.num_model_calls
    torch.testing.assert_close(one.per_sample, ref.per_sample, rtol=1e-5, atol=0)  # padding
    with pytest.raises(ValueError, match="batch_size"):
        mpt_curve(tiny, SENTENCES, batch_size=0, **kw)


def test_device_refusals(monkeypatch):
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            distributed.resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="each rank takes cuda:LOCAL_RANK"):
        distributed.resolve_device("cuda:1")


def test_accelerate_cpu_flag_starting_one_process_is_refused(monkeypatch):
    """What `accelerate launch --cpu --num_processes 2` sets in its one process."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    with pytest.raises(ValueError, match="starts ONE process.*--multi_gpu --num_processes N"):
        distributed.distributed_context()


# ---------------------------------------------------------------------- CLI
def _per_seq(path: Path) -> list[dict]:
    with open(path / "per_sequence.csv") as f:
        return list(csv.DictReader(f))


def test_curve_device_and_dtype_recorded(tiny_dir, texts_file, tmp_path):
    out = tmp_path / "run"
    assert main(["curve", "--model", str(tiny_dir), "--data", str(texts_file), "--out", str(out),
                 "--rates", "0.2,0.6", "--device", "cpu", "--dtype", "float64",
                 "--batch-size", "3", "--no-progress"]) == 0
    res = json.loads((out / "results.json").read_text())
    cfg, model = res["config"], res["results"]["models"]["pretrained"]
    assert cfg["device"] == model["device"] == "cpu"
    assert cfg["dtype"] == model["dtype"] == "float64"
    # the config holds the settings as given; results the device, dtype and autocast that ran
    assert cfg["autocast"] is None and cfg["batch_size"] == 3 and model["world_size"] == 1
    assert main(["curve", "--model", str(tiny_dir), "--data", str(texts_file),
                 "--out", str(tmp_path / "ac"), "--rates", "0.2,0.6", "--autocast",
                 "--no-progress"]) == 0
    ac = json.loads((tmp_path / "ac" / "results.json").read_text())
    ran = ac["results"]["models"]["pretrained"]
    assert ac["config"]["autocast"] is True
    assert ran["autocast"] == "bfloat16" and ran["dtype"] == "float32"


@pytest.mark.slow
def test_reproduce_antibody_takes_the_mlm_flags(tmp_path, capsys):
    pytest.importorskip("antiberty")
    out = tmp_path / "a"
    assert main(["reproduce", "antibody", "--quick", "--out", str(out), "--device", "cpu",
                 "--dtype", "float32", "--no-autocast", "--batch-size", "16",
                 "--set", "num_sequences=1", "--set", "rates=0.1:0.99:0.4"]) == 0
    res = json.loads((out / "results.json").read_text())
    for m in res["results"]["models"].values():
        assert m["device"] == "cpu" and m["dtype"] == "float32" and m["world_size"] == 1
        assert m["autocast"] is None
    assert main(["reproduce", "area", "--quick", "--out", str(tmp_path / "x"),
                 "--dtype", "float64"]) == 2
    assert "masked-LM parts" in capsys.readouterr().err


# ---------------------------------------------------------------------- data parallel
def _run(cmd: list[str], env: dict) -> float:
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    # a rank's own message (e.g. "mptlml: error: ...") comes before the launcher's trace
    ours = [ln for ln in p.stderr.splitlines() if "mptlml" in ln and "rror" in ln][:5]
    assert p.returncode == 0, "\n".join(ours) + "\n...\n" + p.stderr[-3000:]
    return time.perf_counter() - t


@pytest.fixture(scope="module")
def one_process(tiny_dir, texts_file, tmp_path_factory):
    """The 1-process reference run of the data-parallel tests."""
    out = tmp_path_factory.mktemp("dp") / "one"
    env = {**os.environ, "PYTHONPATH": str(Path(mptlml.__file__).resolve().parents[1]),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    common = ["curve", "--model", str(tiny_dir), "--data", str(texts_file),
              "--rates", "0.1:0.9:0.2", "--num-masks", "2", "--chunk-size", "2",
              "--seed", "3", "--pll", "--no-progress"]
    _run([sys.executable, "-m", "mptlml", *common, "--out", str(out)], env)
    return out, common, env


def _assert_equal_runs(one: Path, two: Path) -> None:
    res = json.loads((two / "results.json").read_text())
    assert res["results"]["models"]["pretrained"]["world_size"] == 2
    a, b = _per_seq(one), _per_seq(two)
    assert [r["id"] for r in a] == [r["id"] for r in b]
    for col in ("lml_riemann", "pll", "area"):
        np.testing.assert_allclose([float(r[col]) for r in b], [float(r[col]) for r in a],
                                   rtol=0, atol=1e-6)
    assert a == b  # on the CPU even bit for bit: a chunk is scored whole, by one rank


@pytest.mark.slow
@pytest.mark.xdist_group("launchers")  # one launcher at a time (ports)
def test_torchrun_two_processes_equal_one(one_process, tmp_path):
    one, common, env = one_process
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
          "2", "-m", "mptlml", *common, "--out", str(tmp_path / "two")], env)
    _assert_equal_runs(one, tmp_path / "two")


_SLOW_MAIN_RANK = """
import os, sys, time
import mptlml._scoring.ragged as runner
check = runner.check_meta
def late(*a, **k):  # the main rank reaches its fingerprint check late (a loaded machine)
    if os.environ.get("RANK") == "0":
        time.sleep(3)
    return check(*a, **k)
runner.check_meta = late
from mptlml.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.xdist_group("launchers")  # one launcher at a time (ports)
def test_a_late_main_rank_meets_no_worker_chunks(one_process, tmp_path):
    """Workers wait for the main rank's checkpoint fingerprint before writing any chunk.

    Before the barrier a worker could save its first chunk while the main rank
    was still on its way to ``meta.json``; the main rank then found chunks
    without a fingerprint and refused its own run (exit 2), seen once under load.
    """
    one, common, env = one_process
    script = tmp_path / "late_main.py"
    script.write_text(_SLOW_MAIN_RANK)
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
          "2", str(script), *common, "--out", str(tmp_path / "two")], env)
    _assert_equal_runs(one, tmp_path / "two")


@pytest.mark.slow
@pytest.mark.xdist_group("launchers")  # one launcher at a time (ports)
def test_accelerate_launch_two_processes_equal_one(one_process, tmp_path):
    """The README's CPU line: accelerate launch --multi_gpu --num_processes 2 (no GPU here)."""
    one, common, env = one_process
    _run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
          "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
          "--dynamo_backend", "no", "-m", "mptlml", *common, "--out", str(tmp_path / "two")],
         env)
    _assert_equal_runs(one, tmp_path / "two")


# ---------------------------------------------------------------------- data
def test_glue_style_parquet_and_tsv_through_datasets(tmp_path, tiny_dir):
    pd = pytest.importorskip("pandas")
    pq = tmp_path / "mrpc.parquet"
    pd.DataFrame({"sentence1": ["the cat sat", "a dog ran"], "sentence2": ["on a mat", "far"],
                  "label": [1, 0], "idx": [17, 18]}).to_parquet(pq)
    d = load_texts(pq, column="sentence1,sentence2")
    assert d.texts == ["the cat sat on a mat", "a dog ran far"] and d.ids == ["17", "18"]
    with pytest.raises(ValueError, match=r"has columns .*sentence1.*--column"):
        load_texts(pq)
    with pytest.raises(ValueError, match="column 'sentence' not in"):
        load_texts(pq, column="sentence")
    with pytest.raises(ValueError, match="split.*applies to glue:TASK"):
        load_texts(pq, column="sentence1", split="validation")
    cola = tmp_path / "in_domain_dev.tsv"  # original CoLA: no header, quotes kept
    cola.write_text('gj04\t1\t\tthe "big" cat sat\ngj04\t0\t*\tdog the ran\n')
    d = load_texts(cola, column="3")
    assert d.texts == ['the "big" cat sat', "dog the ran"]
    hdr = tmp_path / "dev.tsv"
    hdr.write_text("sentence\tlabel\nthe cat\t1\n\t0\n")
    with pytest.raises(ValueError, match="row 2 has no field 'sentence'"):
        load_texts(hdr, column="sentence")
    out = tmp_path / "run"
    assert main(["curve", "--model", str(tiny_dir), "--data", str(pq), "--column",
                 "sentence1,sentence2", "--rates", "0.5", "--out", str(out),
                 "--no-progress"]) == 0
    assert [r["id"] for r in _per_seq(out)] == ["17", "18"]


def test_glue_offline_without_cache_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    t = time.perf_counter()
    with pytest.raises(ValueError, match="not in the local datasets cache.*HF_HUB_OFFLINE"):
        load_texts("glue:cola")
    assert time.perf_counter() - t < 30  # no network retries


def test_no_socket_probe_left():
    import mptlml.models.hf_loading as hf

    src = Path(hf.__file__).read_text()
    assert "import socket" not in src and "create_connection" not in src
