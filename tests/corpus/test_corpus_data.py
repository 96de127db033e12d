"""The corpus harness itself: decoders, preprocessing, labels and metrics against hand-made cases (oracles
that do not come from the harness's own output), the silero streaming protocol against a recording fake,
determinism of the data makers, and the float models' task figures above floors (a broken preprocessing,
dictionary or label rule shows up there as a collapse, not a few points)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from . import measure_float, models, ocr, speech

# --------------------------------------------------------------------------------------------- models


@pytest.mark.parametrize("name", models.NAMES)
def test_model_files_are_found_without_importing_the_packages(name):
    import sys

    found = models.require(name)
    assert found.is_file() and found.suffix == ".onnx" and found.stat().st_size > 100_000
    assert "rapidocr_onnxruntime" not in sys.modules and "silero_vad" not in sys.modules


def test_unknown_model_name():
    with pytest.raises(KeyError, match="unknown corpus model"):
        models.path("nope")


def test_missing_wheel_skips_with_a_reason(monkeypatch):
    monkeypatch.setitem(models.MODELS, "ghost", ("no-such-distribution-xyz", "x/model.onnx", ""))
    assert not models.available("ghost")
    with pytest.raises(models.ModelNotInstalled, match="no-such-distribution-xyz"):
        models.path("ghost")
    with pytest.raises(pytest.skip.Exception, match="no-such-distribution-xyz wheel"):
        models.require("ghost")


def test_ort_runner_takes_a_path_or_bytes():
    file = models.require("ocr_cls")
    data = ocr.make_cls_data(4, seed=5)
    by_path = models.ort_runner(file)({"x": data.images})
    by_bytes = models.ort_runner(file.read_bytes())({"x": data.images})
    assert isinstance(by_path, list) and len(by_path) == 1 and by_path[0].shape == (4, 2)
    np.testing.assert_array_equal(by_path[0], by_bytes[0])


# ------------------------------------------------------------------------------------- CTC decoding

CHARS = ("blank", "a", "b", "c", " ")


def _one_hot(path, n_classes=len(CHARS), peak=0.9):
    probs = np.full((len(path), n_classes), (1 - peak) / (n_classes - 1), np.float32)
    probs[np.arange(len(path)), path] = peak
    return probs


@pytest.mark.parametrize(
    "path, text",
    [
        ([1, 1, 0, 1, 2, 2, 0, 0, 3], "aabc"),  # a blank separates a repeated character
        ([1, 1, 1, 2, 2, 3, 3], "abc"),  # repeats without a blank merge
        ([0, 0, 0, 0], ""),
        ([0, 4, 1, 4, 4, 2, 0, 4], " a b "),  # the space is a class like any other (the last index)
        ([3], "c"),
        ([2, 0, 2, 0, 2], "bbb"),
    ],
)
def test_ctc_greedy_decode(path, text):
    assert ocr.ctc_greedy_decode(_one_hot(path)[None], CHARS) == [text]
    assert ocr.ctc_decode_indices(np.array([path]), CHARS) == [text]


def test_ctc_decode_batch_and_argmax():
    # the argmax, not the first above some level, decides; rows are independent
    probs = np.array(
        [
            [[0.1, 0.5, 0.4, 0, 0], [0.2, 0.1, 0.6, 0.1, 0], [0.9, 0.05, 0.05, 0, 0]],
            [[0.3, 0.0, 0.0, 0.35, 0.35], [0.4, 0.3, 0.3, 0, 0], [0.0, 0.0, 0.0, 0.0, 1.0]],
        ],
        np.float32,
    )
    assert ocr.ctc_greedy_decode(probs, CHARS) == ["ab", "c "]


def test_ctc_decode_rejects_a_dictionary_of_the_wrong_size():
    with pytest.raises(ValueError, match="5 classes but 4 characters"):
        ocr.ctc_greedy_decode(np.zeros((1, 3, 5), np.float32), CHARS[:4])


def test_rec_characters_follow_rapidocr():
    models.require("ocr_rec")
    chars = ocr.rec_characters()
    assert len(chars) == 6625  # the recogniser's output classes
    assert chars[0] == "blank" and chars[-1] == " "  # CTCLabelDecode: blank inserted first, " " appended
    assert all(len(c) == 1 for c in chars[1:])
    assert " " not in chars[1:-1]
    for c in "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.,:;!?()$%/-\"'":
        assert c in chars[1:-1]


# ----------------------------------------------------------------------------------- preprocessing


def test_resize_norm_line_keeps_the_aspect_ratio_and_pads_with_zero():
    white = np.full((24, 40), 255, np.uint8)  # 40 / 24 -> ceil(48 * 40 / 24) = 80 columns
    x = ocr.resize_norm_line(white, 48, 320)
    assert x.shape == (3, 48, 320) and x.dtype == np.float32
    np.testing.assert_array_equal(x[:, :, :80], 1.0)  # (255 / 255 - 0.5) / 0.5
    np.testing.assert_array_equal(x[:, :, 80:], 0.0)
    black = np.zeros((10, 100), np.uint8)  # 10:1, wider than 320 / 48: squeezed to the full width
    np.testing.assert_array_equal(ocr.resize_norm_line(black, 48, 320), -1.0)
    y = ocr.resize_norm_line(np.full((30, 31), 51, np.uint8), 48, 192)  # ceil(48 * 31 / 30) = ceil(49.6) = 50
    np.testing.assert_allclose(y[:, :, :50], 51 / 127.5 - 1, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(y[:, :, 50:], 0.0)


@pytest.mark.parametrize(
    "hw, expected",
    [
        ((480, 600), (736, 928)),  # x 736/480: 736 x 920 -> round(28.75) * 32
        ((552, 552), (736, 736)),
        ((600, 720), (736, 896)),  # 736 x 883.2 -> int 883 -> round(27.59) * 32
        ((800, 1000), (800, 992)),  # short side >= 736: no scaling, only rounding (31.25 -> 31)
        ((1000, 500), (1472, 736)),
    ],
)
def test_det_resized_shape(hw, expected):
    assert ocr.det_resized_shape(*hw) == expected


def test_det_preprocess_values():
    x = ocr.det_preprocess(np.full((600, 720), 0, np.uint8))
    assert x.shape == (1, 3, 736, 896) and x.dtype == np.float32
    np.testing.assert_array_equal(x, -1.0)


# ------------------------------------------------------------------------------------- OCR metrics


def test_edit_distance_and_cer():
    assert ocr.edit_distance("kitten", "sitting") == 3
    assert ocr.edit_distance("", "abc") == 3 and ocr.edit_distance("abc", "abc") == 0
    assert ocr.char_error_rate(["abd", " xyz "], ["abc", "xyz"]) == pytest.approx(1 / 6)


def test_exact_match_strips_only_the_ends():
    assert ocr.exact_match([" a b ", "ab", "a  b"], ["a b", "a b", "a b"]) == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        ocr.exact_match(["a"], ["a", "b"])


def test_cls_accuracy():
    probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    assert ocr.cls_accuracy(probs, np.array([0, 1, 1, 1])) == 0.75


def test_mask_iou():
    a = np.zeros((10, 10), bool)
    b = np.zeros((10, 10), bool)
    a[0:4, 0:5] = True  # 20
    b[2:6, 0:5] = True  # 20, overlap 10
    assert ocr.mask_iou(a, b) == pytest.approx(10 / 30)
    assert ocr.mask_iou([a, a], [b, a]) == pytest.approx((10 + 20) / (30 + 20))  # pooled
    assert ocr.mask_iou(np.zeros((3, 3), bool), np.zeros((3, 3), bool)) == 1.0
    assert ocr.det_iou([np.where(a, 0.31, 0.29)], [np.where(b, 0.9, 0.0)]) == pytest.approx(10 / 30)


def test_gt_mask_shrinks_like_db_labels():
    page = ocr.DetPage(
        image=np.zeros((736, 736), np.uint8),
        x=np.zeros((1, 3, 736, 736), np.float32),
        boxes=np.array([[100.0, 100.0, 200.0, 120.0]]),
        texts=("x",),
    )
    # D = A (1 - 0.4^2) / L = 2000 * 0.84 / 240 = 7
    assert page.gt_mask(shrink=True).sum() == (113 - 107) * (193 - 107)
    assert page.gt_mask(shrink=False).sum() == 100 * 20
    half = ocr.DetPage(page.image[:368, :368], page.x, np.array([[50.0, 50.0, 100.0, 60.0]]), ("x",))
    assert half.gt_mask(shrink=False).sum() == 100 * 20  # boxes scale to the model's resolution


def test_det_boxes_postprocess():
    prob = np.zeros((100, 200), np.float32)
    prob[40:50, 20:120] = 0.9  # a text kernel: 10 x 100, after the 2x2 dilation 11 x 101
    prob[80:90, 150:190] = 0.35  # above thresh 0.3 but its mean score is under box_thresh 0.5
    prob[5:7, 5:50] = 0.9  # 2 rows: after dilation 3, kept (min side 3)
    boxes = ocr.det_boxes(prob)
    assert len(boxes) == 2
    big = boxes[np.argmax((boxes[:, 2] - boxes[:, 0]))]
    l, t, r, b = big
    w, h = r - l, b - t
    d = 101 * 11 * 1.6 / (2 * (101 + 11))  # unclip: A * ratio / L
    assert w == pytest.approx(101 + 2 * d) and h == pytest.approx(11 + 2 * d)
    assert (l + r) / 2 == pytest.approx(70.0, abs=0.51) and (t + b) / 2 == pytest.approx(45.0, abs=0.51)


# -------------------------------------------------------------------------------------- OCR data


def test_ocr_text_uses_only_dictionary_characters():
    models.require("ocr_rec")
    chars = set(ocr.rec_characters()[1:])
    rng = np.random.default_rng(0)
    text = "".join(ocr.random_text(rng, 5) for _ in range(400))
    assert set(text) <= chars


def test_rec_data_shapes_and_no_squeezing():
    data = ocr.make_rec_data(12, seed=3)
    assert data.images.shape == (12, 3, 48, 320) and data.images.dtype == np.float32
    assert data.images.min() >= -1.0 and data.images.max() <= 1.0
    for raw, image in zip(data.raw, data.images):
        h, w = raw.shape
        assert w / h <= 320 / 48
        width = math.ceil(48 * w / h)
        assert not np.all(image[:, :, width - 1] == 0.0)
        np.testing.assert_array_equal(image[:, :, width:], 0.0)


def test_cls_data_is_balanced():
    data = ocr.make_cls_data(20, seed=4)
    assert data.images.shape == (20, 3, 48, 192)
    assert sorted(np.bincount(data.labels)) == [10, 10]


def test_det_pages_boxes_hold_the_ink():
    (page,) = ocr.make_det_pages(1, seed=9)
    assert page.x.shape[2] % 32 == 0 and page.x.shape[3] % 32 == 0
    assert len(page.boxes) == len(page.texts) >= 3
    ink = page.image < page.image.mean() - 60  # dark pixels: text ink (ink <= 90, background >= 170)
    inside = np.zeros_like(ink)
    for l, t, r, b in page.boxes.astype(int):
        inside[t:b, l:r] = True
    assert ink[inside].sum() > 0.95 * ink.sum()
    for (l1, t1, r1, b1), (l2, t2, r2, b2) in zip(page.boxes[:-1], page.boxes[1:]):
        assert b1 < t2  # lines do not overlap


def test_ocr_data_is_deterministic():
    a, b = ocr.make_rec_data(6, seed=11), ocr.make_rec_data(6, seed=11)
    assert a.labels == b.labels
    np.testing.assert_array_equal(a.images, b.images)
    assert ocr.make_rec_data(6, seed=12).labels != a.labels
    c, d = ocr.make_cls_data(6, seed=11), ocr.make_cls_data(6, seed=11)
    np.testing.assert_array_equal(c.images, d.images)
    np.testing.assert_array_equal(c.labels, d.labels)
    (p,), (q,) = ocr.make_det_pages(1, seed=11), ocr.make_det_pages(1, seed=11)
    np.testing.assert_array_equal(p.image, q.image)
    np.testing.assert_array_equal(p.boxes, q.boxes)


# ---------------------------------------------------------------------------------------- speech


@pytest.mark.parametrize("up, down", [(16000, 22050), (3, 2), (1, 3), (160, 147)])
def test_resample_poly_matches_scipy(up, down):
    signal = pytest.importorskip("scipy.signal")
    x = np.random.default_rng(1).standard_normal(3001)
    ours = speech.resample_poly(x, up, down)
    theirs = signal.resample_poly(x, up, down)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-12)


def test_trim():
    x = np.array([0, 0.0005, 0.002, 0, -0.3, 0, 0.0009, 0], np.float32)
    np.testing.assert_array_equal(speech.trim(x), x[2:5])
    assert speech.trim(np.zeros(5, np.float32)).size == 0


def _bursts(frames_on, n_frames, frame=512, amp=0.5, quiet=()):
    """A clean track with a 440 Hz tone in the listed frames (and at -50 dB in the ``quiet`` ones)."""
    t = np.arange(n_frames * frame) / 16000
    tone = np.sin(2 * np.pi * 440 * t)
    x = np.zeros(n_frames * frame)
    for k in frames_on:
        x[k * frame : (k + 1) * frame] = amp * tone[k * frame : (k + 1) * frame]
    for k in quiet:
        x[k * frame : (k + 1) * frame] = amp * 10 ** (-50 / 20) * tone[k * frame : (k + 1) * frame]
    return x


def test_frame_labels_rule():
    # one utterance over frames 2..29: speech 2-5, a 3-frame gap (bridged), 9-11, a 4-frame gap (a pause),
    # 16-18, a faint frame 19 (-50 dB: inactive, trailing, not bridged), nothing after
    on = [2, 3, 4, 5, 9, 10, 11, 16, 17, 18]
    x = _bursts(on, 32, quiet=[19])
    labels = speech.frame_labels(x, [(2 * 512, 30 * 512)])
    expected = np.zeros(32, bool)
    expected[2:12] = True
    expected[16:19] = True
    np.testing.assert_array_equal(labels, expected)
    # a gap between two utterances is never bridged, and nothing outside a span is speech
    two = speech.frame_labels(x, [(2 * 512, 6 * 512), (8 * 512, 12 * 512)])
    expected2 = np.zeros(32, bool)
    expected2[2:6] = True
    expected2[9:12] = True
    np.testing.assert_array_equal(two, expected2)
    # a span boundary inside a frame makes that frame part of the utterance (partial last frame too)
    assert speech.frame_labels(x[: 5 * 512 + 100], [(2 * 512 + 300, 5 * 512 + 100)]).tolist() == [
        False, False, True, True, True, True,
    ]


class _RecordingVad:
    """A fake silero: records its feeds, returns the mean of the chunk as the 'probability' and state + 1."""

    def __init__(self):
        self.feeds = []

    def __call__(self, feeds):
        self.feeds.append({k: np.array(v, copy=True) for k, v in feeds.items()})
        return [np.array([[feeds["input"][0, 64:].mean()]], np.float32), feeds["state"] + 1]


def test_vad_streaming_protocol():
    audio = np.arange(3 * 512 + 100, dtype=np.float32) / 1000  # 3 full chunks + 100 samples
    fake = _RecordingVad()
    probs = speech.vad_probabilities(fake, audio)
    assert len(fake.feeds) == 4 and probs.shape == (4,)
    padded = np.concatenate([audio, np.zeros(412, np.float32)])  # the last chunk is zero-padded
    for k, feed in enumerate(fake.feeds):
        assert set(feed) == {"input", "state", "sr"}
        assert feed["input"].shape == (1, 576) and feed["input"].dtype == np.float32
        context = np.zeros(64, np.float32) if k == 0 else padded[k * 512 - 64 : k * 512]
        np.testing.assert_array_equal(feed["input"][0, :64], context)
        np.testing.assert_array_equal(feed["input"][0, 64:], padded[k * 512 : (k + 1) * 512])
        assert feed["state"].shape == (2, 1, 128) and feed["state"].dtype == np.float32
        np.testing.assert_array_equal(feed["state"], k)  # zeros first, then the previous stateN
        assert feed["sr"].shape == () and feed["sr"].dtype == np.int64 and int(feed["sr"]) == 16000
        assert probs[k] == pytest.approx(padded[k * 512 : (k + 1) * 512].mean())


def test_vad_metrics():
    p = np.array([0.1, 0.6, 0.5, 0.9])
    q = np.array([0.2, 0.4, 0.51, 0.95])
    assert speech.decision_agreement(p, q) == 0.5
    assert speech.label_accuracy(p, np.array([0, 1, 1, 1], bool)) == 0.75  # 0.5 is not > 0.5
    assert speech.max_abs_diff(p, q) == pytest.approx(0.2)


def test_speech_data():
    speech.require_espeak()
    a = speech.make_speech_data(2, seed=7)
    b = speech.make_speech_data(2, seed=7)
    np.testing.assert_array_equal(a.audio, b.audio)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert a.audio.dtype == np.float32 and len(a.audio) % 512 == 0 and a.n_frames == len(a.audio) // 512
    assert len(a.spans) == len(a.texts) == 2
    (s0, e0), (s1, e1) = a.spans
    assert 0.5 * 16000 <= s0 <= 1.5 * 16000 and 0.4 * 16000 <= s1 - e0 <= 2.5 * 16000
    assert e0 - s0 > 16000  # a sentence lasts more than a second
    # labels: speech only inside spans, most of each span speech, the silences not
    inside = np.zeros(a.n_frames, bool)
    for s, e in a.spans:
        inside[s // 512 : -(-e // 512)] = True
    assert not a.labels[~inside].any()
    assert a.labels[inside].mean() > 0.6
    # the noise floor is low: the silences are quiet, the speech is not
    assert np.abs(a.audio[: s0 - 512]).max() < 0.02 < np.abs(a.audio[s0:e0]).max()
    c = speech.make_speech_data(2, seed=8)
    assert c.texts != a.texts or len(c.audio) != len(a.audio) or not np.array_equal(c.audio, a.audio)


# --------------------------------------------------------------------------- float model figures

FLOORS = {
    "ocr_rec": {"exact match": 0.90, "exact match ignoring spaces": 0.95},
    "ocr_cls": {"accuracy": 0.90},
    # the map's thin kernels against DB's shrunk boxes are ~0.5-0.55 IoU; the post-processed boxes ~0.77
    "ocr_det": {
        "IoU of the map (p > 0.3) vs the shrunk ground-truth boxes": 0.40,
        "IoU of the detected boxes vs the ground-truth boxes": 0.60,
    },
    "vad": {"accuracy vs labels": 0.85},
    "vad_op15": {"accuracy vs labels": 0.85},
}


@pytest.mark.parametrize("name", models.NAMES)
def test_float_model_task_figures(name):
    models.require(name)
    data = measure_float.data(name)
    out = measure_float.float_outputs(name)
    figures = measure_float.figures(name, out, data)
    for figure, floor in FLOORS[name].items():
        assert figures[figure] >= floor, (figure, figures)
    if name == "ocr_rec":
        assert figures["character error rate"] < 0.03


def test_the_two_vad_exports_agree():
    models.require("vad")
    a, b = measure_float.float_outputs("vad"), measure_float.float_outputs("vad_op15")
    assert speech.decision_agreement(a, b) >= 0.98
    assert speech.max_abs_diff(a, b) < 0.05
