"""Labelled wake-word clips synthesized with espeak-ng, and the task of openWakeWord 0.5.1's bundled models: the
"alexa" and "hey jarvis" heads on Google's speech embedding.

The pipeline reproduces openWakeWord's ONNX path (``utils.py``: ``AudioFeatures``; ``model.py``: ``Model.predict``
and ``predict_clip``; read from the installed wheel, not imported) with one ``run(feeds) -> list`` callable per
model, so that each model can be swapped for a quantized one:

1. ``predict_clip`` pads the int16 clip with 1 s of zeros at both ends and feeds it in chunks of 1280 samples
   (80 ms; ``range(0, len - 1280, 1280)``, so a last partial chunk is dropped).
2. Mel spectrogram (``melspectrogram.onnx``, PyTorch; input ``input`` float32 [1, samples], the int16 values
   as they are, not scaled): frames of 10 ms, each from a window of the samples after it, no padding
   (``ceil(samples / 160 - 3)`` frames), power in dB floored at 80 dB under the loudest value *of the whole
   input* (a ``ReduceMax`` over the tensor: torchaudio's ``top_db``); the output is squeezed to [frames, 32] and
   mapped by ``x / 10 + 2`` (``_get_melspectrogram``'s ``melspec_transform``). Streaming, each chunk's 8 frames
   come from a call on its 1280 samples and the 480 before them (``_streaming_melspectrogram``; 5 frames from the
   first chunk alone), so the floor follows those 1760 samples: the frames of one call on the whole clip differ
   (by up to 11.75 here, in quiet frames; the "slight numerical issues" its docstring mentions), and so do
   those of a batch of segments (the floor is taken over the batch). Reproduced here: one call per chunk.
3. Embedding (``embedding_model.onnx``, Keras via tf2onnx; ``input_1`` [N, 76, 32, 1] -> [N, 1, 1, 96]): after
   chunk k the stream embeds the last 76 mel frames of its buffer; the buffer starts with 76 rows of ones, so
   from chunk 10 on these are the clip's frames ``8k - 79 .. 8k - 4``: windows starting at frames 1, 9, 17, ...
   (not 0, 8, 16 as ``_get_embeddings`` for whole clips does).
4. Head (``alexa_v0.1.onnx``, ``hey_jarvis_v0.1.onnx``, PyTorch, Dense layers as Gemm; [1, 16, 96] -> [1, 1]):
   after chunk k the score of the last 16 embeddings (``get_features(16)``), one call per chunk.

Only the chunks whose 16 embeddings all come from the clip's own frames are scored: k >= 25, i.e. from 2.0 s
into the padded clip (1.0 s into the clip itself). The earlier ones also see the 76 rows of ones and the
embeddings ``AudioFeatures`` fills its buffer with at start (of 4 s of unseeded random noise: not
reproducible), and openWakeWord zeroes the first 5 predictions anyway. From k = 25 on the scores are
openWakeWord's own: compared with ``openwakeword.Model(..., inference_framework="onnx").predict_clip`` (a fresh
``Model`` per clip) on 16 clips, they differ by 2.6e-6 at most. The first scored chunk sees the padded clip's
0.01-2.0 s, so speech at the very start of a clip is still scored whole (the clips made here start with
0.2-0.8 s of noise anyway).

Clips (``make_wake_data``): the wake phrase (positives) or another phrase (negatives: everyday phrases and, for
a third of them, phrases that sound somewhat like the wake phrase) spoken by espeak-ng with a random voice of
the phrase's ``VOICES``, speed 130-175 words per minute and pitch 35-70, trimmed, scaled to a peak of 0.5-0.9 of
full scale, with 0.2-0.8 s before and 0.3-0.9 s after it, white noise at -65 to -50 dBFS through the clip, as
int16 at 16 kHz. espeak-ng is a formant synthesizer, not what the heads were trained on (the README: "100%
synthetic speech generated from text-to-speech models", neural ones), yet the float models fire on it, given
the right voices (see ``VOICES``) and loudness: quiet clips (peaks of 0.1-0.3) fire far less often. On the
default data (20 positive and 20 negative clips per phrase) the float pipelines decide every clip right:
"alexa" positives score 0.976-1.0 and negatives at most 0.055, "hey jarvis" positives 0.895-1.0 and negatives
at most 0.306.

Figures: accuracy of the clip decisions (max score over the clip > 0.5, openWakeWord's default threshold)
against the labels (``wake_accuracy``), the decision agreement of two pipelines (``decision_agreement``) and the
Pearson correlation of their score curves (``curve_correlation``).

The pretrained models of openWakeWord (all of ``resources/models``) are licensed CC BY-NC-SA 4.0 (its README):
they are used here to test, never shipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .models import Runner
from .speech import SR, synthesize, trim

CHUNK = 1280  # samples per streaming step (80 ms)
PAD_SECONDS = 1  # predict_clip's padding at both ends
MEL_BINS = 32
WINDOW = 76  # mel frames per embedding
STEP = 8  # mel frames per chunk
N_FEATURES = 16  # embeddings per head input
FIRST_SCORED_CHUNK = 25  # the first chunk whose 16 embeddings are all the clip's own
EMBED_START = 1  # the first streaming window starts at mel frame 1 (8 * 10 - 79)
THRESHOLD = 0.5

# phrase -> (corpus model name of the head, the head's input name)
HEADS = {
    "alexa": ("wake_alexa", "onnx::Flatten_0"),
    "hey jarvis": ("wake_hey_jarvis", "x.1"),
}

# espeak-ng voices (language + variant) per phrase, for its positive and negative clips alike, chosen by
# measurement: 10 clips of the phrase per voice as ``make_wake_data`` makes them, 105 voices (en-gb, en-gb-x-rp,
# en-gb-x-gbclan, en-gb-scotland, en-us, en-us-nyc, en-029, each plain and with 14 variants). The float "alexa"
# head fired on all 10 clips with every en-gb voice and every en-gb-x-gbclan one but +david (5 of 10), on 3-10 of
# 10 with the en-gb-x-rp ones, 0-10 with the American ones (en-us 4, en-us+f1..f3 3-4; en-us+klatt 10, but 37 of
# 40 in a later run), 0-8 with the Scottish ones and 0-2 with the Caribbean (en-029) ones: espeak's American
# "alexa" is not the one the head learnt. "hey jarvis" fired on all 10 with 78 of the 105 voices, on fewer mostly
# with en-029 and en-gb-x-gbclan ones. The lists below are voices that fired on 10 of 10, of several families and
# variants.
VOICES = {
    "alexa": ("en-gb", "en-gb+m1", "en-gb+m3", "en-gb+m7", "en-gb+f1", "en-gb+f3", "en-gb+klatt", "en-gb+Annie",
              "en-gb-x-gbclan", "en-gb-x-gbclan+m7", "en-gb-x-gbclan+f3", "en-gb-x-gbclan+klatt2", "en-gb-x-rp+m7",
              "en-gb-x-rp+belinda"),
    "hey jarvis": ("en-us", "en-us+f3", "en-us+m3", "en-us+Annie", "en-us+klatt2", "en-us-nyc+m1", "en-gb",
                   "en-gb+f2", "en-gb-x-rp", "en-gb-x-rp+m7", "en-gb-x-gbclan+f3", "en-gb-scotland",
                   "en-gb-scotland+f1", "en-gb-scotland+m7"),
}

NEGATIVE_PHRASES = (
    "good morning", "turn on the lights", "what time is it", "open the door", "hello there", "thank you very much",
    "see you tomorrow", "play some music", "how are you", "the weather is nice", "call my mother",
    "set a timer", "where are my keys", "it is raining again", "let us go home", "stop the music",
)
# Phrases that sound somewhat like the wake phrase, about a third of the negatives. Measured (10 clips each, with
# the phrase's voices): these score up to 0.08-0.46 on the float head but did not fire ("alex", "alexander",
# "electric", "hey marvin" stay under 0.02); left out because the float head fired on some of their clips:
# "election" (1 of 10), "a letter" (3), "lexicon" (3); "hey travis" (1), "hey charles" (6), "hey doris" (4); and,
# at 0.49-0.50, "I left her" and "hey jealous".
CONFUSABLE = {
    "alexa": ("lexi", "a texan", "alaska", "alex", "alexander", "electric"),
    "hey jarvis": ("hey service", "hey darling", "hey nervous", "jars of jam", "the jar is", "hey marvin"),
}


@dataclass(frozen=True)
class WakeRunners:
    """The three runners of one pipeline and the head's input name."""

    melspectrogram: Runner
    embedding: Runner
    head: Runner
    head_input: str


def wake_runners(phrase: str, *, melspectrogram: Runner | None = None, embedding: Runner | None = None,
                 head: Runner | None = None) -> WakeRunners:
    """The pipeline for ``phrase`` ("alexa" or "hey jarvis"): the runners given, and onnxruntime sessions of the
    float models (``models.ort_runner``) for the others."""
    from .models import ort_runner, path

    head_name, head_input = HEADS[phrase]
    return WakeRunners(
        melspectrogram if melspectrogram is not None else ort_runner(path("wake_melspectrogram")),
        embedding if embedding is not None else ort_runner(path("wake_embedding")),
        head if head is not None else ort_runner(path(head_name)),
        head_input,
    )


# ------------------------------------------------------------------------------------------ pipeline


def padded_clip(clip: np.ndarray) -> np.ndarray:
    """``predict_clip``'s input: 1 s of zeros at both ends, cut to the whole chunks it feeds (int16)."""
    clip = np.asarray(clip)
    if clip.dtype != np.int16:
        raise ValueError(f"clips are int16 PCM (openWakeWord's input), not {clip.dtype}")
    pad = np.zeros(SR * PAD_SECONDS, np.int16)
    audio = np.concatenate([pad, clip, pad])
    n_chunks = len(range(0, len(audio) - CHUNK, CHUNK))
    return audio[: n_chunks * CHUNK]


def melspectrogram(run: Runner, audio: np.ndarray) -> np.ndarray:
    """The transformed mel spectrogram [frames, 32] (``x / 10 + 2``, float32) of one call on int16 ``audio``."""
    x = np.asarray(audio, np.int16).astype(np.float32)[None]
    spec = np.squeeze(np.asarray(run({"input": x})[0]))
    return (spec / 10 + 2).astype(np.float32).reshape(-1, MEL_BINS)


def streaming_melspectrogram(run: Runner, audio: np.ndarray) -> np.ndarray:
    """The mel frames openWakeWord's stream computes for ``audio`` (a whole number of chunks): one call per chunk
    on that chunk and the 480 samples before it, 5 frames from the first chunk and 8 from each next one."""
    n_chunks = len(audio) // CHUNK
    parts = [melspectrogram(run, audio[max(0, k * CHUNK - CHUNK - 3 * 160) : k * CHUNK])
             for k in range(1, n_chunks + 1)]
    return np.concatenate(parts) if parts else np.zeros((0, MEL_BINS), np.float32)


def embedding_inputs(spec: np.ndarray) -> np.ndarray:
    """The embedding model's inputs for the streaming windows of ``spec``: 76 frames starting at frame 1, 9, 17, ...
    (one per chunk from chunk 10 on), float32 [n, 76, 32, 1]."""
    starts = range(EMBED_START, spec.shape[0] - WINDOW + 1, STEP)
    if len(starts) == 0:
        return np.zeros((0, WINDOW, MEL_BINS, 1), np.float32)
    return np.stack([spec[s : s + WINDOW] for s in starts])[..., None].astype(np.float32)


def embeddings(run: Runner, spec: np.ndarray) -> np.ndarray:
    """The speech embeddings [n, 96] of the streaming windows of ``spec`` (``embedding_inputs``), in one batch."""
    batch = embedding_inputs(spec)
    if len(batch) == 0:
        return np.zeros((0, 96), np.float32)
    return np.asarray(run({"input_1": batch})[0], np.float32).reshape(len(batch), -1)


def head_inputs(features: np.ndarray) -> np.ndarray:
    """Every 16 consecutive embeddings, float32 [m, 16, 96]: the head's inputs (fed one at a time, [1, 16, 96])."""
    if len(features) < N_FEATURES:
        return np.zeros((0, N_FEATURES, features.shape[-1]), np.float32)
    return np.stack([features[k - N_FEATURES : k] for k in range(N_FEATURES, len(features) + 1)]).astype(np.float32)


def head_scores(run: Runner, features: np.ndarray, input_name: str) -> np.ndarray:
    """The head's score of every 16 consecutive embeddings (one call each: the head's batch axis is 1)."""
    return np.array([np.asarray(run({input_name: x[None]})[0]).reshape(-1)[0] for x in head_inputs(features)],
                    np.float32)


def score_curve(runners: WakeRunners, clip: np.ndarray) -> np.ndarray:
    """The head's score after each chunk of ``predict_clip`` from chunk 25 on (one per 80 ms), float32."""
    spec = streaming_melspectrogram(runners.melspectrogram, padded_clip(clip))
    return head_scores(runners.head, embeddings(runners.embedding, spec), runners.head_input)


def wake_curves(runners: WakeRunners, clips) -> list[np.ndarray]:
    return [score_curve(runners, clip) for clip in clips]


def wake_scores(runners: WakeRunners, clips) -> np.ndarray:
    """The maximum score over each clip (float32 [N]), openWakeWord's clip-level detection score."""
    return np.array([curve.max() if curve.size else 0.0 for curve in wake_curves(runners, clips)], np.float32)


# ------------------------------------------------------------------------------------------ figures


def wake_accuracy(scores: np.ndarray, labels: np.ndarray, threshold: float = THRESHOLD) -> float:
    """Fraction of clips whose decision (max score > ``threshold``) matches the label."""
    return float(np.mean((np.asarray(scores) > threshold) == np.asarray(labels, bool)))


def decision_agreement(scores_a: np.ndarray, scores_b: np.ndarray, threshold: float = THRESHOLD) -> float:
    """Fraction of clips where two pipelines' decisions (max score > ``threshold``) agree."""
    return float(np.mean((np.asarray(scores_a) > threshold) == (np.asarray(scores_b) > threshold)))


def curve_correlation(curves_a: list[np.ndarray], curves_b: list[np.ndarray]) -> float:
    """Pearson correlation of two pipelines' score curves, all clips' curves concatenated (1.0 if equal)."""
    a = np.concatenate([np.asarray(c, np.float64) for c in curves_a])
    b = np.concatenate([np.asarray(c, np.float64) for c in curves_b])
    if a.shape != b.shape:
        raise ValueError(f"curves of {a.shape} and {b.shape} scores")
    if np.array_equal(a, b):
        return 1.0
    return float(np.corrcoef(a, b)[0, 1])


def max_abs_diff(scores_a: np.ndarray, scores_b: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(scores_a, np.float64) - np.asarray(scores_b, np.float64))))


# -------------------------------------------------------------------------------------------- data


@dataclass(frozen=True)
class WakeData:
    clips: tuple[np.ndarray, ...]  # int16 [n_i], 16 kHz
    labels: np.ndarray  # bool [N]: the clip says the wake phrase
    texts: tuple[str, ...]
    voices: tuple[str, ...]  # "voice speed pitch" of each clip

    def __len__(self) -> int:
        return len(self.labels)


def _clip(text: str, rng: np.random.Generator, voices: tuple[str, ...]) -> tuple[np.ndarray, str]:
    voice = voices[rng.integers(len(voices))]
    speed, pitch = int(rng.integers(130, 176)), int(rng.integers(35, 71))
    x = trim(synthesize(text, voice=voice, speed=speed, pitch=pitch)).astype(np.float64)
    x *= rng.uniform(0.5, 0.9) / max(float(np.abs(x).max()), 1e-6)
    before, after = (np.zeros(int(rng.uniform(*span) * SR)) for span in ((0.2, 0.8), (0.3, 0.9)))
    x = np.concatenate([before, x, after])
    x += rng.normal(0.0, 10.0 ** (rng.uniform(-65, -50) / 20.0), x.shape)
    return np.clip(np.rint(x * 32767), -32768, 32767).astype(np.int16), f"{voice} {speed} {pitch}"


def make_wake_data(phrase: str, n_pos: int = 20, n_neg: int = 20, seed: int = 20261207,
                   voices: tuple[str, ...] | None = None) -> WakeData:
    """``n_pos`` clips of ``phrase`` and ``n_neg`` of other phrases (a third of them confusable), in a seeded
    random order (see the module docstring)."""
    if phrase not in HEADS:
        raise ValueError(f"no head for {phrase!r}; known: {', '.join(HEADS)}")
    voices = VOICES[phrase] if voices is None else voices
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n_pos + n_neg) < n_pos)
    clips, texts, used = [], [], []
    for positive in labels:
        if positive:
            text = phrase
        elif rng.random() < 1 / 3:
            text = CONFUSABLE[phrase][rng.integers(len(CONFUSABLE[phrase]))]
        else:
            text = NEGATIVE_PHRASES[rng.integers(len(NEGATIVE_PHRASES))]
        clip, voice = _clip(text, rng, voices)
        clips.append(clip)
        texts.append(text)
        used.append(voice)
    return WakeData(tuple(clips), labels, tuple(texts), tuple(used))
