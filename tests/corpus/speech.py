"""Labelled speech for the silero voice activity detector (silero-vad 6.2.3), synthesized with espeak-ng.

The audio: English sentences spoken by espeak-ng (varied voices, speeds, pitches and loudness), each one
trimmed of espeak's own leading / trailing silence, resampled from espeak's 22050 Hz to 16 kHz
(``resample_poly``: scipy.signal.resample_poly's filter, in NumPy), and laid out with silences of 0.4-2.5 s
between them (0.5-1.5 s before the first); low-level white noise (-62 to -52 dBFS) runs through the whole
recording. Everything is drawn from a seeded generator, so the same seed gives the same audio (on the same
espeak-ng version).

The labels, one per 512-sample frame (32 ms, the model's chunk), are ``frame_labels``: speech where the
synthesized utterances are, refined by energy (see there). The runner, ``vad_probabilities``, feeds the
model as silero's ``OnnxWrapper`` does (``utils_vad.py``, read from the installed wheel; the package is not
imported, it needs torch): chunks of 512 samples, the last one zero-padded (``get_speech_timestamps``),
each preceded by the 64 samples of context (zeros at the start, then the tail of the previous model input),
the ``state`` [2, 1, 128] starting at zeros and fed back from ``stateN``, and ``sr`` an int64 scalar 16000.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import tempfile
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .models import Runner

SR = 16000
FRAME = 512  # samples per model call at 16 kHz
CONTEXT = 64  # samples of the previous input prepended to each chunk at 16 kHz

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "We will meet at the station at half past nine, unless the train is late.",
    "Six spoons of fresh snow peas, five thick slabs of blue cheese, and maybe a snack for her brother.",
    "The weather tomorrow will be cloudy in the morning, with light rain in the afternoon.",
    "I have never seen such a beautiful sunset over the mountains.",
    "Could you tell me the way to the nearest library?",
    "The committee decided to postpone the meeting until next Thursday.",
    "After the long winter, the river finally started to flow again.",
    "My phone number is five five five, one two three, four five six seven.",
    "Reading a good book on a rainy afternoon is one of life's simple pleasures.",
    "The engineers measured the voltage twice before they replaced the circuit board.",
    "She opened the window, listened for a moment, and then closed it again.",
    "Our flight leaves at seven in the evening and lands shortly after midnight.",
    "Turn left at the second traffic light and keep going for about two miles.",
    "Every child in the class wrote a short story about their favourite animal.",
)

VOICES = ("en-us", "en-gb", "en-us+f3", "en-gb+m3", "en-gb-x-rp+f2", "en-029", "en-gb-scotland+m4", "en-us+f4")


def espeak() -> str | None:
    """The espeak-ng executable, or None when it is not installed."""
    return shutil.which("espeak-ng")


def require_espeak() -> str:
    """For tests: the espeak-ng executable, or ``pytest.skip`` with the reason."""
    import pytest

    exe = espeak()
    if exe is None:
        pytest.skip("espeak-ng is not installed (Debian/Ubuntu: apt-get install espeak-ng); the speech corpus needs it")
    return exe


def synthesize(text: str, *, voice: str = "en-us", speed: int = 160, pitch: int = 50) -> np.ndarray:
    """``text`` spoken by espeak-ng, as float32 samples in [-1, 1] at 16 kHz."""
    exe = espeak()
    if exe is None:
        raise FileNotFoundError("espeak-ng is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "utterance.wav"
        subprocess.run(
            [exe, "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", str(out), text],
            check=True,
            capture_output=True,
        )
        with wave.open(str(out), "rb") as w:
            rate, width, channels = w.getframerate(), w.getsampwidth(), w.getnchannels()
            frames = w.readframes(w.getnframes())
    if width != 2 or channels != 1:
        raise RuntimeError(f"espeak-ng wrote {channels} channel(s) of {8 * width}-bit samples; expected mono 16-bit")
    x = np.frombuffer(frames, "<i2").astype(np.float64) / 32768.0
    return resample_poly(x, SR, rate).astype(np.float32)


def resample_poly(x: np.ndarray, up: int, down: int, *, half_taps: int = 10, beta: float = 5.0) -> np.ndarray:
    """Polyphase resampling by ``up / down`` with the same filter and alignment as
    ``scipy.signal.resample_poly`` (its defaults: a Kaiser(5.0)-windowed sinc low-pass at the lower of the
    two Nyquist rates, ``2 * 10 * max(up, down) + 1`` taps, unit DC gain, zeros beyond the ends); the
    tests check it against scipy. NumPy only: importing scipy.signal takes 3-5 s here, longer than the
    whole speech corpus takes to make."""
    g = math.gcd(up, down)
    up, down = up // g, down // g
    x = np.asarray(x, np.float64)
    if up == down == 1:
        return x.copy()
    max_rate = max(up, down)
    half_len = half_taps * max_rate
    n = np.arange(-half_len, half_len + 1)
    h = np.sinc(n / max_rate) * np.kaiser(2 * half_len + 1, beta)
    h *= up / h.sum()
    n_out = -(-len(x) * up // down)
    t = np.arange(n_out, dtype=np.int64) * down  # output sample j sits at t = j * down on the upsampled grid
    first = -((half_len - t) // up)  # ceil((t - half_len) / up): the first input sample within reach
    y = np.zeros(n_out)
    for k in range(2 * half_len // up + 2):
        i = first + k
        tap = t - i * up + half_len
        ok = (tap >= 0) & (tap <= 2 * half_len) & (i >= 0) & (i < len(x))
        y[ok] += h[tap[ok]] * x[i[ok]]
    return y


def trim(x: np.ndarray, level: float = 1e-3) -> np.ndarray:
    """``x`` without its leading and trailing samples quieter than ``level`` (espeak's own silence)."""
    loud = np.flatnonzero(np.abs(x) > level)
    return x[loud[0] : loud[-1] + 1] if loud.size else x[:0]


def frame_labels(
    speech: np.ndarray,
    spans: list[tuple[int, int]] | tuple[tuple[int, int], ...],
    *,
    frame: int = FRAME,
    rel_db: float = -35.0,
    bridge_frames: int = 3,
) -> np.ndarray:
    """Per-frame speech labels (bool, one per ``frame`` samples, the last frame possibly partial).

    ``speech`` is the clean speech track (the utterances alone, without the noise), ``spans`` the
    [start, end) sample ranges of the utterances in it. The rule:

    1. Only frames overlapping an utterance's span can be speech; everything between utterances is not.
    2. Inside an utterance, a frame is *active* when the clean speech energy in it is within ``rel_db``
       (-35 dB) of that utterance's loudest frame. This drops the pauses espeak inserts at commas and
       within sentences, and the faint tails at the span's edges.
    3. Runs of inactive frames no longer than ``bridge_frames`` (3 frames, 96 ms) with active frames on
       both sides in the same utterance are labelled speech: closures of stop consonants and short gaps
       between words are part of a speech segment, not pauses. The 100 ms is silero's own
       ``get_speech_timestamps`` default (``min_silence_duration_ms=100``: a shorter silence does not end
       a segment). Longer pauses (espeak's at commas and between clauses) stay non-speech.
    """
    speech = np.asarray(speech, np.float64)
    n_frames = -(-len(speech) // frame)
    padded = np.zeros(n_frames * frame)
    padded[: len(speech)] = speech
    energy = (padded.reshape(n_frames, frame) ** 2).mean(axis=1)
    labels = np.zeros(n_frames, bool)
    for start, end in spans:
        if end <= start:
            continue
        f0, f1 = start // frame, -(-end // frame)
        e = energy[f0:f1]
        ref = e.max()
        if ref <= 0:
            continue
        active = e > ref * 10.0 ** (rel_db / 10.0)
        idx = np.flatnonzero(active)
        for a, b in zip(idx[:-1], idx[1:]):
            if 1 < b - a <= bridge_frames + 1:
                active[a + 1 : b] = True
        labels[f0:f1] |= active
    return labels


@dataclass(frozen=True)
class SpeechData:
    audio: np.ndarray  # float32 [n], 16 kHz, a multiple of FRAME long
    labels: np.ndarray  # bool [n // FRAME]
    speech: np.ndarray  # float32 [n], the utterances alone (no noise)
    spans: tuple[tuple[int, int], ...]  # [start, end) samples of each utterance
    texts: tuple[str, ...]

    @property
    def seconds(self) -> float:
        return len(self.audio) / SR

    @property
    def n_frames(self) -> int:
        return len(self.labels)


def make_speech_data(n_utterances: int = 6, seed: int = 20240604) -> SpeechData:
    """``n_utterances`` different sentences (of ``SENTENCES``) with silences between them; see the module
    docstring. About 5-7 s per utterance with its silence (6 utterances: ~35 s)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(SENTENCES))[:n_utterances]
    pieces: list[np.ndarray] = [np.zeros(int(rng.uniform(0.5, 1.5) * SR), np.float32)]
    spans, texts = [], []
    pos = len(pieces[0])
    for k, i in enumerate(order):
        voice = VOICES[rng.integers(len(VOICES))]
        speed, pitch = int(rng.integers(140, 186)), int(rng.integers(35, 71))
        x = trim(synthesize(SENTENCES[i], voice=voice, speed=speed, pitch=pitch))
        x = x * np.float32(rng.uniform(0.25, 0.9) / max(float(np.abs(x).max()), 1e-6))
        pieces.append(x)
        spans.append((pos, pos + len(x)))
        texts.append(SENTENCES[i])
        pos += len(x)
        gap = rng.uniform(0.4, 2.5) if k < len(order) - 1 else rng.uniform(0.5, 1.0)
        pieces.append(np.zeros(int(gap * SR), np.float32))
        pos += len(pieces[-1])
    speech = np.concatenate(pieces)
    speech = np.concatenate([speech, np.zeros(-len(speech) % FRAME, np.float32)])
    noise = rng.normal(0.0, 10.0 ** (rng.uniform(-62, -52) / 20.0), speech.shape)
    audio = np.clip(speech + noise, -1.0, 1.0).astype(np.float32)
    return SpeechData(audio, frame_labels(speech, spans), speech, tuple(spans), tuple(texts))


def vad_probabilities(run: Runner, audio: np.ndarray, sr: int = SR) -> np.ndarray:
    """Run a silero VAD model over ``audio`` chunk by chunk as ``OnnxWrapper`` does (see the module
    docstring); one speech probability per 512-sample frame (float32)."""
    if sr != SR:
        raise ValueError("the corpus runs silero at 16 kHz only")
    audio = np.asarray(audio, np.float32)
    n_frames = -(-len(audio) // FRAME)
    padded = np.zeros(n_frames * FRAME, np.float32)
    padded[: len(audio)] = audio
    state = np.zeros((2, 1, 128), np.float32)
    context = np.zeros(CONTEXT, np.float32)
    rate = np.array(sr, np.int64)
    probs = np.empty(n_frames, np.float32)
    for k in range(n_frames):
        x = np.concatenate([context, padded[k * FRAME : (k + 1) * FRAME]])[None, :]
        out, state = run({"input": x, "state": state, "sr": rate})[:2]
        probs[k] = np.asarray(out).reshape(-1)[0]
        state = np.asarray(state, np.float32)
        context = x[0, -CONTEXT:]
    return probs


def decision_agreement(p: np.ndarray, q: np.ndarray, threshold: float = 0.5) -> float:
    """Fraction of frames where the two runs' decisions (probability > ``threshold``) agree."""
    return float(np.mean((np.asarray(p) > threshold) == (np.asarray(q) > threshold)))


def label_accuracy(p: np.ndarray, labels: np.ndarray, threshold: float = 0.5) -> float:
    """Fraction of frames whose decision (probability > ``threshold``) matches the label."""
    return float(np.mean((np.asarray(p) > threshold) == np.asarray(labels, bool)))


def max_abs_diff(p: np.ndarray, q: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(p, np.float64) - np.asarray(q, np.float64))))
