"""The float corpus models in onnxruntime: each one's task figure on its labelled data, the data's size, and
the wall time of making the data, loading the session and running it.

    uv run python -m tests.corpus.measure_float            (from the repository root)
    uv run python tests/corpus/measure_float.py            (also works)

``DATA_MAKERS`` and ``figures`` are what the tests use too, so the sizes here are the sizes tested.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

if __package__ in (None, ""):  # run as a script path: make the package importable
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "corpus"

from . import ocr, speech  # noqa: E402
from .models import MODELS, Runner, available, ort_runner, path  # noqa: E402

# Sizes: the whole five-model run must stay cheap (2 cores here). The recogniser dominates: ~90 ms per
# 48x320 line on this machine, whatever the batch.
REC_LINES = 150
CLS_LINES = 200
DET_PAGES = 8
SPEECH_UTTERANCES = 6

DATA_MAKERS: dict[str, Callable[[], Any]] = {
    "ocr_rec": lambda: ocr.make_rec_data(REC_LINES),
    "ocr_cls": lambda: ocr.make_cls_data(CLS_LINES),
    "ocr_det": lambda: ocr.make_det_pages(DET_PAGES),
    "vad": lambda: speech.make_speech_data(SPEECH_UTTERANCES),
}
DATA_MAKERS["vad_op15"] = DATA_MAKERS["vad"]


_MADE: dict = {}


def data(name: str) -> Any:
    """The labelled data of corpus model ``name``, made once per process (the two VAD models share it)."""
    maker = DATA_MAKERS[name]
    if id(maker) not in _MADE:
        if name.startswith("vad"):
            speech.require_espeak()
        _MADE[id(maker)] = maker()
    return _MADE[id(maker)]


def float_outputs(name: str) -> Any:
    """The float model's outputs on ``data(name)`` in onnxruntime, computed once per process."""
    if ("float", name) not in _MADE:
        _MADE[("float", name)] = outputs(name, ort_runner(path(name)), data(name))
    return _MADE[("float", name)]


def data_size(name: str, data: Any) -> str:
    if name == "ocr_rec":
        return f"{len(data)} lines"
    if name == "ocr_cls":
        return f"{len(data)} lines ({int(data.labels.sum())} rotated)"
    if name == "ocr_det":
        return f"{len(data)} pages, {sum(len(p.boxes) for p in data)} lines"
    return f"{data.seconds:.1f} s, {data.n_frames} frames ({data.labels.mean():.0%} speech)"


def outputs(name: str, run: Runner, data: Any) -> Any:
    """The model's raw task outputs on ``data`` (what ``figures`` scores and two runs compare)."""
    if name == "ocr_rec":
        return ocr.run_rec(run, data)
    if name == "ocr_cls":
        return ocr.run_cls(run, data)
    if name == "ocr_det":
        return ocr.run_det(run, data)
    return speech.vad_probabilities(run, data.audio)


def figures(name: str, out: Any, data: Any) -> dict[str, float]:
    """The task figures of one run's outputs against the labels; the first is the headline figure."""
    if name == "ocr_rec":
        return {
            "exact match": ocr.exact_match(out.texts, data.labels),
            "exact match ignoring spaces": ocr.exact_match(
                [t.replace(" ", "") for t in out.texts], [lab.replace(" ", "") for lab in data.labels]
            ),
            "character error rate": ocr.char_error_rate(out.texts, data.labels),
        }
    if name == "ocr_cls":
        return {"accuracy": ocr.cls_accuracy(out, data.labels)}
    if name == "ocr_det":
        return {
            "IoU of the map (p > 0.3) vs the shrunk ground-truth boxes": ocr.det_gt_iou(out, data),
            "IoU of the detected boxes vs the ground-truth boxes": ocr.det_box_iou(out, data),
        }
    return {"accuracy vs labels": speech.label_accuracy(out, data.labels)}


def against_float(name: str, float_out: Any, quantized_out: Any, data: Any) -> dict:
    """The headline task figure of a float and a quantized run, and how far the quantized run is from the
    float one ("vs float": the detector's map IoU, the VAD's equal decisions, equal texts, equal predictions)."""
    before, after = figures(name, float_out, data), figures(name, quantized_out, data)
    key = next(iter(before))
    result = {"figure": key, "float": before[key], "quantized": after[key]}
    if name == "ocr_det":
        result["vs float"], result["vs float name"] = ocr.det_iou(float_out, quantized_out), "map IoU (p > 0.3)"
    elif name.startswith("vad"):
        result["vs float"], result["vs float name"] = speech.decision_agreement(float_out, quantized_out), "decisions equal"
        result["max probability difference"] = speech.max_abs_diff(float_out, quantized_out)
    elif name == "ocr_rec":
        result["vs float"] = ocr.exact_match(quantized_out.texts, [t.strip(" ") for t in float_out.texts])
        result["vs float name"] = "texts equal"
    else:
        result["vs float"] = float((quantized_out.argmax(1) == float_out.argmax(1)).mean())
        result["vs float name"] = "predictions equal"
    return result


def main() -> int:
    names = [n for n in MODELS if available(n)]
    missing = [n for n in MODELS if n not in names]
    if missing:
        print(f"not installed (skipped): {', '.join(missing)}")
    if "vad" in names or "vad_op15" in names:
        if speech.espeak() is None:
            print("espeak-ng is not installed: the VAD models are skipped")
            names = [n for n in names if not n.startswith("vad")]
    print(f"fonts: {', '.join('Pillow default' if f is None else f.rsplit('/', 1)[-1] for f in ocr.font_faces())}")
    made: dict[int, tuple[Any, float]] = {}
    results: dict[str, Any] = {}
    total = 0.0
    print(f"{'model':9} {'data':40} {'make s':>7} {'load s':>7} {'run s':>7}  figures")
    for name in names:
        maker = DATA_MAKERS[name]
        if id(maker) in made:
            data, make_s = made[id(maker)][0], 0.0
        else:
            t0 = time.perf_counter()
            data = maker()
            make_s = time.perf_counter() - t0
            made[id(maker)] = (data, make_s)
        t0 = time.perf_counter()
        run = ort_runner(path(name))
        load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = outputs(name, run, data)
        run_s = time.perf_counter() - t0
        results[name] = out
        total += make_s + load_s + run_s
        figs = "; ".join(f"{k} {v:.4f}" for k, v in figures(name, out, data).items())
        print(f"{name:9} {data_size(name, data):40} {make_s:7.2f} {load_s:7.2f} {run_s:7.2f}  {figs}")
    if "vad" in results and "vad_op15" in results:
        a, b = results["vad"], results["vad_op15"]
        print(
            f"vad vs vad_op15: decisions agree on {speech.decision_agreement(a, b):.4f} of the frames, "
            f"max |probability difference| {speech.max_abs_diff(a, b):.2e}"
        )
    print(f"total (data making + loading + running): {total:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
