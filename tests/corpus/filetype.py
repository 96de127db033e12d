"""Labelled files for Google's Magika 0.5.1 file-type detector (`standard_v1`: a Keras model of Dense layers
converted by tf2onnx), and its task: the type of each file, top-1 against the label.

Features reproduce ``magika/magika.py`` of the 0.5.1 wheel (``_extract_features_from_seekable`` and the
``_get_{beg,mid,end}_ints_with_padding`` helpers, read from the installed wheel, not imported): the model's
``model_config.json`` gives 512 bytes each of the beginning, middle and end, with ``magika_config.json``'s block of
4096 and padding token 256. A file shorter than 2 x 4096 + 512 bytes is stripped of ASCII whitespace at both
ends and gives all three parts (the beginning padded on the right, the middle centred with padding on both sides,
the end padded on the left); a longer one gives the first block left-stripped, the last block right-stripped and
512 bytes from the middle of what lies between. Input ``bytes``: float32 [N, 1536]; output ``target_label``:
softmax [N, 113] over ``target_labels_space``; the type is the argmax (Magika's own thresholds, which turn an
unsure answer into "unknown", are not applied: they would hide a changed argmax).

Files: text of known types read from the installed packages of this project's lock file (Python, C headers,
JSON, Markdown, HTML, JavaScript, CSS, YAML, reStructuredText, CSV, SVG, TrueType fonts, ELF shared objects),
so the same files on every machine with the same lock; and files written here with Pillow and the standard
library (JPEG, PNG, GIF, BMP, TIFF, WebP, PDF, ZIP, tar, gzip, bzip2, xz, WAV), from a seeded generator.
"""

from __future__ import annotations

import bz2
import functools
import gzip
import io
import json
import lzma
import sysconfig
import tarfile
import wave
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BEG, MID, END, BLOCK, PADDING = 512, 512, 512, 4096, 256
MIN_SIZE = 16  # magika_config.json's min_file_size_for_dl: smaller files never reach the model
# label -> file name suffix searched in site-packages (sorted, then drawn with the seed)
FOUND = {"python": ".py", "c": ".h", "json": ".json", "markdown": ".md", "html": ".html", "javascript": ".js",
         "css": ".css", "yaml": ".yaml", "rst": ".rst", "csv": ".csv", "svg": ".svg", "ttf": ".ttf", "elf": ".so"}
MADE = ("jpeg", "png", "gif", "bmp", "tiff", "webp", "pdf", "zip", "tar", "gzip", "bzip", "xz", "wav")


@functools.cache
def labels() -> tuple[str, ...]:
    from .models import path

    config = json.loads((path("filetype").parent / "model_config.json").read_text())
    return tuple(config["train_dataset_info"]["target_labels_info"]["target_labels_space"])


def features(content: bytes) -> list[int]:
    """Magika 0.5.1's features of a file's bytes (see the module docstring)."""
    if len(content) < 2 * BLOCK + MID:
        beg = mid = end = content.strip()
    else:
        beg = content[:BLOCK].lstrip()
        end = content[len(content) - BLOCK:].rstrip()
        trimmed_beg, trimmed_end = BLOCK - len(beg), BLOCK - len(end)
        start = trimmed_beg + (len(content) - trimmed_beg - trimmed_end - MID) // 2
        mid = content[start:start + MID]
    beg_ints = list(beg[:BEG]) + [PADDING] * max(0, BEG - len(beg))
    if MID <= len(mid):
        first = (len(mid) - MID) // 2
        mid = mid[first:first + MID]
    missing = MID - len(mid)
    mid_ints = [PADDING] * (missing // 2) + list(mid) + [PADDING] * (missing - missing // 2)
    end = end[len(end) - END:] if END <= len(end) else end
    end_ints = [PADDING] * (END - len(end)) + list(end)
    return beg_ints + mid_ints + end_ints


@dataclass(frozen=True)
class FileTypeData:
    features: np.ndarray  # float32 [N, 1536]
    labels: tuple[str, ...]
    sources: tuple[str, ...]  # where each file came from

    def __len__(self) -> int:
        return len(self.labels)


@functools.cache
def _all_site_files() -> dict[str, tuple[Path, ...]]:
    """The installed packages' files of 1 KB to 4 MB by suffix (one walk), sorted."""
    root = Path(sysconfig.get_paths()["purelib"])
    found: dict[str, list[Path]] = {}
    wanted = set(FOUND.values())
    for p in root.rglob("*"):
        if p.suffix in wanted and ".dist-info" not in p.parts[-2] and p.is_file() and 1024 <= p.stat().st_size <= 4 << 20:
            found.setdefault(p.suffix, []).append(p)
    return {suffix: tuple(sorted(files)) for suffix, files in found.items()}


def _site_files(suffix: str) -> tuple[Path, ...]:
    return _all_site_files().get(suffix, ())


def _made(label: str, rng: np.random.Generator, text: bytes) -> bytes:
    from PIL import Image

    if label in ("jpeg", "png", "gif", "bmp", "tiff", "webp", "pdf"):
        h, w = (int(v) for v in rng.integers(24, 160, 2))
        base = rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
        image = Image.fromarray(base).resize((w, h), Image.Resampling.BILINEAR)
        buffer = io.BytesIO()
        image.save(buffer, {"jpeg": "JPEG", "png": "PNG", "gif": "GIF", "bmp": "BMP", "tiff": "TIFF", "webp": "WEBP",
                            "pdf": "PDF"}[label])
        return buffer.getvalue()
    if label == "zip":
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("module.py", text)
            archive.writestr("notes.txt", text[::-1])
        return buffer.getvalue()
    if label == "tar":
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            info = tarfile.TarInfo("module.py")
            info.size, info.mtime = len(text), 1700000000
            archive.addfile(info, io.BytesIO(text))
        return buffer.getvalue()
    if label == "gzip":
        return gzip.compress(text, mtime=0)
    if label == "bzip":
        return bz2.compress(text)
    if label == "xz":
        return lzma.compress(text)
    if label == "wav":
        buffer = io.BytesIO()
        with wave.open(buffer, "wb") as sound:
            sound.setnchannels(1)
            sound.setsampwidth(2)
            sound.setframerate(16000)
            seconds = rng.uniform(0.2, 1.5)
            t = np.arange(int(16000 * seconds)) / 16000
            tone = np.sin(2 * np.pi * rng.uniform(100, 2000) * t) * rng.uniform(1000, 20000)
            sound.writeframes((tone + rng.normal(0, 300, t.shape)).astype(np.int16).tobytes())
        return buffer.getvalue()
    raise ValueError(label)


def make_filetype_data(per_label: int = 20, seed: int = 20261204) -> FileTypeData:
    """``per_label`` files of each type in `FOUND` (from the installed packages) and `MADE` (written here)."""
    rng = np.random.default_rng(seed)
    known = set(labels())
    rows, names, sources = [], [], []
    python = _site_files(".py")
    for label, suffix in FOUND.items():
        assert label in known, label
        files = _site_files(suffix)
        for index in rng.choice(len(files), size=min(per_label, len(files)), replace=False):
            content = files[index].read_bytes()
            if len(content) >= MIN_SIZE:
                rows.append(features(content))
                names.append(label)
                sources.append(str(files[index].relative_to(Path(sysconfig.get_paths()["purelib"]))))
    for label in MADE:
        assert label in known, label
        for _ in range(per_label):
            text = python[rng.integers(len(python))].read_bytes()[:20000]
            rows.append(features(_made(label, rng, text)))
            names.append(label)
            sources.append(f"written ({label})")
    return FileTypeData(np.asarray(rows, np.float32), tuple(names), tuple(sources))


def run_filetype(run, data: FileTypeData, batch: int = 64) -> np.ndarray:
    """The model's scores [N, 113]."""
    return np.concatenate([np.asarray(run({"bytes": data.features[s:s + batch]})[0])
                           for s in range(0, len(data), batch)])


def filetype_accuracy(scores: np.ndarray, data: FileTypeData) -> float:
    names = labels()
    return float(np.mean([names[i] == label for i, label in zip(np.argmax(scores, axis=1), data.labels)]))
