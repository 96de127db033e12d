"""Static int8 with the defaults on openWakeWord 0.5.1 beyond the corpus (see test_corpus_more.py): its tf2onnx
speech embedding (Keras: Conv, LeakyRelu, Max as clamps) and a phrase's PyTorch Dense head, each quantized on the
features the float pipeline computes for 20 espeak-ng clips (`wakeword`), measured on 40 others. "hey jarvis" runs by
default, "alexa" in the full suite (--full)."""

from __future__ import annotations

import numpy as np
import pytest

from . import speech, wakeword
from .models import cpu_has_vnni, ort_runner, require, static_int8

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


@pytest.mark.full  # about 20 s a phrase: the full suite's (CI's 10 minutes leave it out)
@pytest.mark.parametrize("phrase", ["alexa", "hey jarvis"])
def test_wake_word_keras_embedding_and_pytorch_dense_head(tmp_path, phrase):
    """openWakeWord: its tf2onnx speech embedding (Conv, LeakyRelu, Max as clamps) and the phrase's PyTorch Dense
    head, each quantized on the features the float pipeline computes for 20 clips, measured on 40 others (20 of
    the phrase): every clip decided as float decides it (measured: 40 of 40 for both phrases, score curves
    correlated 0.99)."""
    speech.require_espeak()
    head_name, head_input = wakeword.HEADS[phrase]
    embedding_source, head_source = require("wake_embedding"), require(head_name)
    calibration = wakeword.make_wake_data(phrase, 10, 10, seed=1)
    evaluation = wakeword.make_wake_data(phrase)
    floating = wakeword.wake_runners(phrase)
    specs = [wakeword.streaming_melspectrogram(floating.melspectrogram, wakeword.padded_clip(clip))
             for clip in calibration.clips]
    np.savez(tmp_path / "embedding.npz", input_1=np.concatenate([wakeword.embedding_inputs(s) for s in specs]))
    features = [wakeword.embeddings(floating.embedding, s) for s in specs]
    np.savez(tmp_path / "head.npz", **{head_input: np.concatenate([wakeword.head_inputs(f) for f in features])})
    static_int8(embedding_source, tmp_path / "embedding.npz", tmp_path / "embedding.int8.onnx")
    static_int8(head_source, tmp_path / "head.npz", tmp_path / "head.int8.onnx")
    float_scores = wakeword.wake_scores(floating, evaluation.clips)
    figures = {}
    for optimized in (False, True) if cpu_has_vnni() else (False,):  # without VNNI: not exact (BENCHMARKS.md)
        quantized = wakeword.wake_runners(phrase, embedding=ort_runner(tmp_path / "embedding.int8.onnx", optimized=optimized),
                                          head=ort_runner(tmp_path / "head.int8.onnx", optimized=optimized))
        scores = wakeword.wake_scores(quantized, evaluation.clips)
        figures[optimized] = (wakeword.wake_accuracy(scores, evaluation.labels),
                              wakeword.decision_agreement(float_scores, scores))
    float_figure = wakeword.wake_accuracy(float_scores, evaluation.labels)
    print(f"\nwake word {phrase!r} ({len(evaluation.labels)} clips): float {100 * float_figure:.1f}%, static int8 "
          f"{100 * figures[False][0]:.1f}% (ONNX semantics); decisions equal to float's {100 * figures[False][1]:.1f}%")
    assert float_figure >= 0.9
    assert figures[False][1] >= 0.95 and figures[False][0] >= float_figure - 0.05
    if True in figures:
        assert figures[True][1] >= 0.95
