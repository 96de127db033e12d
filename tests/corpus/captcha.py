"""Labelled captchas rendered with Pillow, and the tasks of ddddocr 1.6.1's two trained models: the text recogniser
``common.onnx`` and the click-captcha character detector ``common_det.onnx``.

The pre- and post-processing reproduce ddddocr's own code (read from the installed wheel; the package is not
imported, it needs opencv):

- recogniser (``core/ocr_engine.py``, ``OCREngine`` with ``beta=True``, which is what loads ``common.onnx``
  (``models/model_loader.py``: ``load_ocr_model``; without ``beta`` ddddocr loads ``common_old.onnx``) and the
  ``CHARSET_BETA`` list; ``preprocessing/image_processor.py``): ``_preprocess_image`` resizes the RGB image to
  height 64 and width ``int(w * 64 / h)`` with Pillow's LANCZOS (``ImageProcessor.resize_image``), *then* converts
  it to grey (``Image.convert("L")``, ITU-R 601-2 luma) and divides by 255: ``input1`` float32 [1, 1, 64, W]. All
  of this is Pillow in ddddocr too, so it is reproduced exactly. The output is [T, 1, 8210] scores (T = ceil(W / 8));
  ``_process_text_output`` takes the argmax per step, merges repeated indices, drops index 0 (the blank, ``""``
  in the charset) and maps the rest through the charset (``_ctc_decode_indices``). The charset is
  ``CHARSET_BETA`` of ``charsets.py`` (8210 entries, identical to ``models/charset_manager.py``'s
  ``_get_beta_charset``), read here by parsing ``charsets.py`` as text (``ast.literal_eval``), never by importing.
- detector (``core/detection_engine.py``, ``DetectionEngine.get_bbox``): the image is decoded as BGR
  (``cv2.IMREAD_COLOR``) and letterboxed by ``preproc``: scaled by ``r = min(416 / h, 416 / w)`` to
  ``(int(w * r), int(h * r))`` (``cv2.resize``, INTER_LINEAR; Pillow's BILINEAR stands in for it here: the pages
  made below are all scaled *up*, where both interpolate linearly between the four nearest pixels with half-pixel
  centres, differing in rounding and at the border pixels; not compared with opencv here, which is not
  installed; when scaling down Pillow would also low-pass and cv2 not), pasted at the top left of a 416 x 416
  canvas of 114, HWC -> CHW, float32 0..255 (no normalisation): ``images`` [1, 3, 416, 416]. The output
  [1, 3549, 6] (52^2 + 26^2 + 13^2 anchors-free cells) goes through ``demo_postprocess`` (strides 8, 16, 32:
  ``xy = (xy + grid) * stride``, ``wh = exp(wh) * stride``), scores ``obj * cls`` (one class), boxes to corners
  and divided by ``r``, ``multiclass_nms_class_agnostic`` (score > 0.1, then greedy NMS at IoU 0.45 with ddddocr's
  ``+ 1`` pixel areas), and each box is cut to the image and truncated to int as ``get_bbox`` does.

Captchas (``make_captcha_data``): 4-6 characters, lowercase letters and digits with a fifth uppercase letters,
leaving out the look-alikes many captcha generators leave out (``CAPTCHA_LOWER``, ``CAPTCHA_UPPER``); every
character drawn is in ``CHARSET_BETA`` (all ASCII letters and digits are). Each character in its own face
(DejaVu, Liberation, FreeFont and URW base-35 faces, mostly bold, found under /usr/share/fonts), 34-43 px, dark
random colour and rotation (up to +-18 degrees), neighbours overlapping by up to a tenth of a glyph, on a light
random background (flat or a gradient, with low-level noise); then 40-160 noise dots and 1-3 interference lines
or arcs across the text, and sometimes a slight blur, as text captchas look (python's ``captcha`` package, PHP's
Gregwar, Java's Kaptcha); the glyphs are scaled down together when they would not fit. Size 160 x 60, so every
preprocessed input is [1, 1, 64, 170] (22 CTC steps: T = ceil(W / 8)).

Click pages (``make_click_pages``): a background of a two-colour gradient, smooth coloured noise and 4-12
random shapes (ellipses, rectangles, polygons), blurred; 3-6 single characters (common Chinese characters in
WenQuanYi Micro Hei when ``/usr/share/fonts/truetype/wqy/wqy-microhei.ttc`` is present, otherwise, and on a
fifth of the pages anyway, uppercase letters in the Latin faces), 28-60 px, each in a random saturated colour
that stands out from the background under it, rotated up to +-35 degrees, often with a thin outline in a
contrasting colour (as click captchas draw them), at random non-overlapping positions. The label is each
character's ink box: the bounding box of its (outlined, rotated) glyph's coverage above 25%.

Metrics: recogniser exact match (``captcha_accuracy``; case-insensitive by default, see there); detector recall
and precision of one-to-one box matches at IoU >= 0.5 (``box_recall``, ``box_precision``) and the agreement of two
runs (``box_agreement``: the share of a reference run's boxes matched by the other run's). Measured with the
float models in onnxruntime on the default data: 0.95 of 200 captchas read exactly (0.415 with case), and on 50
click pages (237 characters) recall 0.983 and precision 0.975.

Everything is drawn from a seeded generator: the same seed gives the same data on the same machine (the faces
found under /usr/share/fonts decide which are used).
"""

from __future__ import annotations

import ast
import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from .models import Runner
from .ocr import _font, cjk_face, installed_faces

REC_HEIGHT = 64
CAPTCHA_SIZE = (160, 60)  # width, height of the rendered captchas
DET_SIZE = 416
DET_PAD = 114
DET_STRIDES = (8, 16, 32)
DET_NMS = 0.45
DET_SCORE = 0.1


# ------------------------------------------------------------------------------------------ charset


def _charsets_file() -> Path:
    from .models import path

    return path("captcha_rec").parent / "charsets.py"


@functools.cache
def charset(charsets_file: str | None = None, name: str = "CHARSET_BETA") -> tuple[str, ...]:
    """ddddocr's class list for ``common.onnx``: ``CHARSET_BETA`` from ``charsets.py`` (8210 entries, index 0 the
    blank ``""``), parsed as text (the module is never imported)."""
    file = Path(charsets_file) if charsets_file is not None else _charsets_file()
    tree = ast.parse(file.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise ValueError(f"{file} defines no {name}")


# ------------------------------------------------------------------------------------------- fonts

_LATIN_FACE_FILES = (
    "truetype/dejavu/DejaVuSans-Bold.ttf",
    "truetype/dejavu/DejaVuSans.ttf",
    "truetype/dejavu/DejaVuSerif-Bold.ttf",
    "truetype/dejavu/DejaVuSansMono-Bold.ttf",
    "truetype/dejavu/DejaVuSansCondensed-Bold.ttf",
    "truetype/liberation2/LiberationSans-Bold.ttf",
    "truetype/liberation2/LiberationSans-Regular.ttf",
    "truetype/liberation2/LiberationSerif-Bold.ttf",
    "truetype/liberation2/LiberationMono-Bold.ttf",
    "truetype/freefont/FreeSansBold.ttf",
    "truetype/freefont/FreeSerifBold.ttf",
    "truetype/freefont/FreeMonoBold.ttf",
    "opentype/urw-base35/NimbusSans-Bold.otf",
    "opentype/urw-base35/NimbusRoman-Bold.otf",
    "opentype/urw-base35/URWGothic-Demi.otf",
    "opentype/urw-base35/URWBookman-Demi.otf",
)


@functools.cache
def latin_faces() -> tuple[str | None, ...]:
    """The Latin faces found under /usr/share/fonts, or ``(None,)`` (Pillow's built-in scalable font) when none is."""
    return installed_faces(_LATIN_FACE_FILES) or (None,)


# ------------------------------------------------------------------------------------ glyph rendering


def _glyph(char: str, font: ImageFont.FreeTypeFont, angle: float, stroke: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(fill, outline) coverage of one character (float32 0..1, same shape), rotated by ``angle`` degrees
    (bicubic, expanded) and cropped to the ink. ``outline`` is the glyph drawn with a ``stroke`` pixel stroke
    (equal to ``fill`` when ``stroke`` is 0)."""
    left, top, right, bottom = font.getbbox(char, stroke_width=stroke)
    pad = 4 + stroke
    size = (right - left + 2 * pad, bottom - top + 2 * pad)
    layers = []
    for width in (0, stroke) if stroke else (0,):
        mask = Image.new("L", size, 0)
        ImageDraw.Draw(mask).text((pad - left, pad - top), char, fill=255, font=font, stroke_width=width,
                                  stroke_fill=255)
        layers.append(mask.rotate(angle, resample=Image.Resampling.BICUBIC, expand=True))
    if not stroke:
        layers.append(layers[0])
    box = layers[1].getbbox() or (0, 0, *layers[1].size)
    fill, outline = (np.asarray(m.crop(box), np.float32) / 255.0 for m in layers)
    return fill, outline


def _paint(canvas: np.ndarray, alpha: np.ndarray, colour: np.ndarray, x: int, y: int) -> None:
    """Composite ``colour`` with coverage ``alpha`` onto float RGB ``canvas`` [H, W, 3] at (x, y), clipped."""
    h, w = alpha.shape
    H, W = canvas.shape[:2]
    x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + w, W), min(y + h, H)
    if x1 <= x0 or y1 <= y0:
        return
    a = alpha[y0 - y : y1 - y, x0 - x : x1 - x, None]
    region = canvas[y0:y1, x0:x1]
    region *= 1.0 - a
    region += a * colour


def _luma(rgb: np.ndarray) -> float:
    return float(np.dot(rgb, (0.299, 0.587, 0.114)))


# ------------------------------------------------------------------------------------------ captchas

# Lowercase letters and digits, and uppercase letters (a fifth of the characters), without the look-alike groups
# 0 o O Q, 1 l i I j J L, 9 g q, 2 z Z (G is drawn: read as "g", it matches case-insensitively). Measured on 400
# captchas drawn from all of a-z A-Z 0-9: case-insensitive exact match 0.71, the swaps l -> 1 / i, o / O -> 0 and
# g / q -> 9 most of the misses; with these alphabets 0.87-0.95 (six seeds of 200; 0.95 with the default seed),
# the misses mostly dropped or merged characters.
CAPTCHA_LOWER = "abcdefhkmnprstuvwxy2345678"
CAPTCHA_UPPER = "ABCDEFGHKMNPRSTUVWXY"


def _captcha_text(rng: np.random.Generator) -> str:
    n = int(rng.integers(4, 7))
    chars = []
    for _ in range(n):
        pool = CAPTCHA_UPPER if rng.random() < 0.2 else CAPTCHA_LOWER
        chars.append(pool[rng.integers(len(pool))])
    return "".join(chars)


def _light_background(shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """A light RGB background (each channel 200-255): flat, or a linear gradient between two light colours."""
    h, w = shape
    a = rng.uniform(200, 255, 3)
    if rng.random() < 0.5:
        return np.broadcast_to(a, (h, w, 3)).copy()
    b = rng.uniform(200, 255, 3)
    angle = rng.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:h, 0:w]
    t = (xx * math.cos(angle) + yy * math.sin(angle)).astype(np.float64)
    t = (t - t.min()) / max(t.max() - t.min(), 1e-6)
    return a + (b - a) * t[..., None]


def _dark_colour(rng: np.random.Generator, low: int = 0, high: int = 150) -> np.ndarray:
    """A random colour with luma at most ``high`` (redrawn until it is), each channel in [low, 255]."""
    while True:
        c = rng.uniform(low, 255, 3)
        if _luma(c) <= high:
            return c


def render_captcha(text: str, rng: np.random.Generator, size: tuple[int, int] = CAPTCHA_SIZE) -> np.ndarray:
    """One captcha of ``text`` as uint8 RGB [H, W, 3] (see the module docstring)."""
    width, height = size
    faces = latin_faces()
    glyphs = []
    for char in text:
        font = _font(faces[rng.integers(len(faces))], int(rng.integers(34, 44)))
        fill, _ = _glyph(char, font, rng.uniform(-18, 18))
        glyphs.append(fill)
    # lay the glyphs out on a strip: each next one starts 0-10% of its width before the previous one ends
    gaps = [int(-rng.uniform(0.0, 0.10) * g.shape[1]) for g in glyphs[1:]]
    strip_w = sum(g.shape[1] for g in glyphs) + sum(gaps)
    strip_h = max(g.shape[0] for g in glyphs) + 6
    scale = min(1.0, (width - 12) / strip_w, (height - 4) / strip_h)
    canvas = _light_background((height, width), rng)
    canvas += rng.normal(0.0, rng.uniform(0, 6), canvas.shape)
    x = (width - strip_w * scale) / 2 + rng.uniform(-4, 4) * scale
    if x < 2:
        x = 2.0
    for k, g in enumerate(glyphs):
        if scale < 1.0:
            gh, gw = max(1, round(g.shape[0] * scale)), max(1, round(g.shape[1] * scale))
            g = np.asarray(Image.fromarray(np.uint8(np.rint(g * 255))).resize((gw, gh), Image.Resampling.BICUBIC),
                           np.float32) / 255.0
        y = (height - g.shape[0]) / 2 + rng.uniform(-5, 5)
        y = min(max(y, 0), height - g.shape[0])
        _paint(canvas, g, _dark_colour(rng), int(round(x)), int(round(y)))
        x += g.shape[1] + (gaps[k] * scale if k < len(gaps) else 0)
    img = Image.fromarray(np.uint8(np.clip(np.rint(canvas), 0, 255)))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(40, 161))):  # noise dots
        cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(0.5, 1.6)
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    for _ in range(int(rng.integers(1, 4))):  # interference lines and arcs across the text
        colour = tuple(int(v) for v in _dark_colour(rng, high=170))
        line_width = int(rng.integers(1, 3))
        if rng.random() < 0.5:
            y0, y1 = rng.uniform(0.2 * height, 0.8 * height, 2)
            draw.line((rng.uniform(0, 0.2 * width), y0, rng.uniform(0.8 * width, width), y1), fill=colour,
                      width=line_width)
        else:
            box_h = rng.uniform(0.6, 1.6) * height
            top = rng.uniform(0.1 * height, 0.7 * height) - box_h / 2
            start = rng.uniform(180, 250) if rng.random() < 0.5 else rng.uniform(0, 70)
            draw.arc((rng.uniform(-0.2, 0.1) * width, top, rng.uniform(0.9, 1.2) * width, top + box_h), start,
                     start + rng.uniform(80, 160), fill=colour, width=line_width)
    if rng.random() < 0.3:
        img = img.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 0.7)))
    return np.asarray(img)


def rec_preprocess(img: np.ndarray) -> np.ndarray:
    """ddddocr's ``_preprocess_image`` for ``common.onnx``: LANCZOS resize of the RGB image to height 64 and width
    ``int(w * 64 / h)``, then grey (``convert("L")``), / 255: float32 [1, 1, 64, W]."""
    image = Image.fromarray(img)
    w, h = image.size
    image = image.resize((int(w * (REC_HEIGHT / h)), REC_HEIGHT), Image.Resampling.LANCZOS).convert("L")
    return (np.asarray(image, np.float32) / 255.0)[None, None]


@dataclass(frozen=True)
class CaptchaData:
    images: np.ndarray  # float32 [N, 1, 64, W], preprocessed (feed one row at a time: the batch axis is 1)
    labels: tuple[str, ...]
    raw: tuple[np.ndarray, ...]  # the rendered uint8 RGB captchas

    def __len__(self) -> int:
        return len(self.labels)


def make_captcha_data(n: int = 200, seed: int = 20261205) -> CaptchaData:
    """``n`` captchas of 4-6 characters (see the module docstring), preprocessed for ``common.onnx``."""
    rng = np.random.default_rng(seed)
    labels, raw = [], []
    for _ in range(n):
        text = _captcha_text(rng)
        labels.append(text)
        raw.append(render_captcha(text, rng))
    return CaptchaData(np.concatenate([rec_preprocess(img) for img in raw]), tuple(labels), tuple(raw))


def ctc_decode(indices: np.ndarray, characters: tuple[str, ...]) -> str:
    """ddddocr's ``_ctc_decode_indices`` and character lookup: merge runs of the same index, drop index 0."""
    indices = np.asarray(indices).reshape(-1)
    keep = np.ones(indices.shape, bool)
    keep[1:] = indices[1:] != indices[:-1]
    keep &= indices != 0
    return "".join(characters[i] for i in indices[keep])


def run_captcha(run: Runner, data: CaptchaData, *, characters: tuple[str, ...] | None = None) -> list[str]:
    """The recogniser's text for every captcha (one per call: ``input1``'s batch axis is 1)."""
    characters = charset() if characters is None else characters
    texts = []
    for k in range(len(data)):
        scores = np.asarray(run({"input1": data.images[k : k + 1]})[0])  # [T, 1, C]
        if scores.shape[-1] != len(characters):
            raise ValueError(f"recogniser gave {scores.shape[-1]} classes, the charset has {len(characters)}")
        texts.append(ctc_decode(scores[:, 0].argmax(axis=-1), characters))
    return texts


def captcha_accuracy(texts, labels, *, ignore_case: bool = True) -> float:
    """Fraction of captchas read exactly, by default ignoring case, as captcha checks usually do. The model reads
    nearly every uppercase letter as lowercase (measured: of the uppercase letters in the captchas it read at the
    right length, 13% came out uppercase), so with case the float model's figure is set by how many captchas have
    no uppercase letter (0.30-0.44 over six seeds of 200 captchas, against 0.87-0.95 without case)."""
    if len(texts) != len(labels):
        raise ValueError(f"{len(texts)} texts for {len(labels)} labels")
    if ignore_case:
        return float(np.mean([t.lower() == lab.lower() for t, lab in zip(texts, labels)]))
    return float(np.mean([t == lab for t, lab in zip(texts, labels)]))


# ------------------------------------------------------------------------------------- click captchas

# Common Chinese characters (of the most frequent few hundred), drawn one per position on click captchas.
COMMON_CHINESE = tuple(dict.fromkeys(
    "的一是不了人我在有他这中大来上个国到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天"
    "而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些"
    "与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相"
    "次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立"
    "马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共"
    "风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快"
    "条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李"
    "息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯"
))
CLICK_LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"
# page sizes (height, width): all are scaled up into the 416 x 416 letterbox
CLICK_PAGE_SIZES = ((344, 344), (240, 400), (300, 400), (320, 320), (260, 360))


def _smooth_noise(shape: tuple[int, int], cell: int, rng: np.random.Generator) -> np.ndarray:
    """Smooth RGB noise in [-1, 1]: a coarse random grid (one value per ``cell`` pixels) scaled up bicubically."""
    h, w = shape
    coarse = rng.uniform(0, 255, (h // cell + 2, w // cell + 2, 3)).astype(np.uint8)
    big = Image.fromarray(coarse).resize((w + 2 * cell, h + 2 * cell), Image.Resampling.BICUBIC)
    return np.asarray(big, np.float32)[cell : cell + h, cell : cell + w] / 127.5 - 1.0


def _click_background(shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """A busy picture-like background, float RGB [H, W, 3]: a gradient between two random colours, smooth
    coloured noise (+-20-60 levels), 4-12 random ellipses, rectangles and polygons, and a blur."""
    h, w = shape
    a, b = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    angle = rng.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:h, 0:w]
    t = xx * math.cos(angle) + yy * math.sin(angle)
    t = (t - t.min()) / max(t.max() - t.min(), 1e-6)
    bg = a + (b - a) * t[..., None] + rng.uniform(20, 60) * _smooth_noise(shape, int(rng.integers(24, 80)), rng)
    img = Image.fromarray(np.uint8(np.clip(np.rint(bg), 0, 255)))
    draw = ImageDraw.Draw(img, "RGBA")
    for _ in range(int(rng.integers(4, 13))):
        colour = tuple(int(v) for v in rng.integers(0, 256, 3)) + (int(rng.integers(90, 230)),)
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        rx, ry = rng.uniform(0.05, 0.35) * w, rng.uniform(0.05, 0.35) * h
        kind = rng.integers(3)
        if kind == 0:
            draw.ellipse((cx - rx, cy - ry, cx + rx, cy + ry), fill=colour)
        elif kind == 1:
            draw.rectangle((cx - rx, cy - ry, cx + rx, cy + ry), fill=colour)
        else:
            n = int(rng.integers(3, 7))
            angles = np.sort(rng.uniform(0, 2 * math.pi, n))
            draw.polygon([(float(cx + rx * math.cos(q)), float(cy + ry * math.sin(q))) for q in angles], fill=colour)
    img = img.filter(ImageFilter.GaussianBlur(rng.uniform(1.0, 3.0)))
    return np.asarray(img, np.float32) + rng.normal(0.0, rng.uniform(1, 6), (h, w, 3))


def _standing_out(under: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A saturated random colour whose luma differs from ``under``'s (mean RGB) by at least 70 levels, or the
    farthest of 30 tries."""
    best, best_gap = None, -1.0
    for _ in range(30):
        c = rng.uniform(0, 255, 3)
        c[rng.integers(3)] = rng.uniform(0, 60)  # one channel low: a saturated colour
        gap = abs(_luma(c) - _luma(under))
        if gap >= 70:
            return c
        if gap > best_gap:
            best, best_gap = c, gap
    return best


@dataclass(frozen=True)
class ClickPage:
    image: np.ndarray  # uint8 RGB [H, W, 3], the page as rendered
    x: np.ndarray  # float32 [1, 3, 416, 416]: BGR, letterboxed with 114, 0..255
    ratio: float  # the letterbox scale r
    boxes: np.ndarray  # int [K, 4]: each character's ink box (left, top, right, bottom), page pixels, exclusive
    chars: tuple[str, ...]


def det_preprocess(img: np.ndarray) -> tuple[np.ndarray, float]:
    """ddddocr's ``preproc`` for ``common_det.onnx`` on an RGB page (ddddocr's is BGR from ``cv2.imdecode``):
    scale by ``r = min(416 / h, 416 / w)`` to ``(int(w * r), int(h * r))`` (Pillow BILINEAR for cv2 INTER_LINEAR),
    paste at the top left of a 416 x 416 x 3 canvas of 114, BGR, CHW, float32: ([1, 3, 416, 416], r)."""
    h, w = img.shape[:2]
    r = min(DET_SIZE / h, DET_SIZE / w)
    resized = np.asarray(Image.fromarray(img).resize((int(w * r), int(h * r)), Image.Resampling.BILINEAR))
    padded = np.full((DET_SIZE, DET_SIZE, 3), DET_PAD, np.uint8)
    padded[: resized.shape[0], : resized.shape[1]] = resized[..., ::-1]
    return np.ascontiguousarray(padded.transpose(2, 0, 1), dtype=np.float32)[None], r


def make_click_pages(n: int = 50, seed: int = 20261206) -> list[ClickPage]:
    """``n`` click-captcha pages with 3-6 characters each (see the module docstring)."""
    rng = np.random.default_rng(seed)
    cjk, latin = cjk_face(), latin_faces()
    pages = []
    for i in range(n):
        h, w = CLICK_PAGE_SIZES[i % len(CLICK_PAGE_SIZES)]
        canvas = _click_background((h, w), rng)
        letters = cjk is None or rng.random() < 0.2
        boxes, chars = [], []
        for _ in range(int(rng.integers(3, 7))):
            if letters:
                char = CLICK_LETTERS[rng.integers(len(CLICK_LETTERS))]
                face = latin[rng.integers(len(latin))]
            else:
                char = COMMON_CHINESE[rng.integers(len(COMMON_CHINESE))]
                face = cjk
            stroke = int(rng.integers(1, 3)) if rng.random() < 0.6 else 0
            fill, outline = _glyph(char, _font(face, int(rng.integers(28, 61))), rng.uniform(-35, 35), stroke)
            gh, gw = fill.shape
            ink = np.maximum(fill, outline) > 0.25
            rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
            for _attempt in range(50):  # a position inside the page whose ink box keeps 4 px from the others'
                x, y = int(rng.integers(4, w - gw - 3)), int(rng.integers(4, h - gh - 3))
                box = (x + int(cols[0]), y + int(rows[0]), x + int(cols[-1]) + 1, y + int(rows[-1]) + 1)
                if all(box[2] + 4 <= l or box[0] >= r + 4 or box[3] + 4 <= t or box[1] >= b + 4
                       for l, t, r, b in boxes):
                    break
            else:
                continue
            under = canvas[y : y + gh, x : x + gw].reshape(-1, 3).mean(axis=0)
            colour = _standing_out(under, rng)
            if stroke:
                edge = np.full(3, 255.0 if _luma(colour) < 128 else 0.0) + rng.uniform(-30, 30, 3)
                _paint(canvas, outline, np.clip(edge, 0, 255), x, y)
            _paint(canvas, fill, colour, x, y)
            boxes.append(box)
            chars.append(char)
        image = np.uint8(np.clip(np.rint(canvas), 0, 255))
        x_in, r = det_preprocess(image)
        pages.append(ClickPage(image, x_in, r, np.array(boxes, np.int64).reshape(-1, 4), tuple(chars)))
    return pages


def _grids() -> tuple[np.ndarray, np.ndarray]:
    """``demo_postprocess``'s cell offsets [3549, 2] and strides [3549, 1] for a 416 x 416 input."""
    grids, strides = [], []
    for stride in DET_STRIDES:
        size = DET_SIZE // stride
        xv, yv = np.meshgrid(np.arange(size), np.arange(size))
        grids.append(np.stack((xv, yv), 2).reshape(-1, 2))
        strides.append(np.full((size * size, 1), stride))
    return np.concatenate(grids), np.concatenate(strides)


def _nms(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> list[int]:
    """ddddocr's single-class greedy NMS (areas and overlaps with its ``+ 1`` pixel convention)."""
    x1, y1, x2, y2 = boxes.T
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = scores.argsort()[::-1]
    keep = []
    while order.size > 0:
        i = order[0]
        keep.append(int(i))
        w = np.maximum(0.0, np.minimum(x2[i], x2[order[1:]]) - np.maximum(x1[i], x1[order[1:]]) + 1)
        h = np.maximum(0.0, np.minimum(y2[i], y2[order[1:]]) - np.maximum(y1[i], y1[order[1:]]) + 1)
        inter = w * h
        overlap = inter / (areas[i] + areas[order[1:]] - inter)
        order = order[np.where(overlap <= threshold)[0] + 1]
    return keep


def det_postprocess(output: np.ndarray, ratio: float, shape: tuple[int, int], *, score_thr: float = DET_SCORE,
                    nms_thr: float = DET_NMS) -> np.ndarray:
    """ddddocr's ``get_bbox`` after the model: boxes int [K, 4] (left, top, right, bottom) in page pixels of a page
    of ``shape`` (h, w), in NMS order (highest score first)."""
    pred = np.array(output, np.float64).reshape(-1, 6)
    grid, stride = _grids()
    xy = (pred[:, :2] + grid) * stride
    wh = np.exp(pred[:, 2:4]) * stride
    scores = pred[:, 4:5] * pred[:, 5:]
    corners = np.concatenate([xy - wh / 2.0, xy + wh / 2.0], axis=1) / ratio
    cls_scores = scores.max(axis=1)
    valid = cls_scores > score_thr
    if not valid.any():
        return np.zeros((0, 4), np.int64)
    kept = corners[valid][_nms(corners[valid], cls_scores[valid], nms_thr)]
    h, w = shape
    out = []
    for left, top, right, bottom in kept.tolist():
        out.append((0 if left < 0 else int(left), 0 if top < 0 else int(top),
                    w if right > w else int(right), h if bottom > h else int(bottom)))
    return np.array(out, np.int64).reshape(-1, 4)


def run_click(run: Runner, pages: list[ClickPage]) -> list[np.ndarray]:
    """The detected character boxes of every page (int [K, 4], page pixels), one page per call."""
    return [det_postprocess(np.asarray(run({"images": p.x})[0]), p.ratio, p.image.shape[:2]) for p in pages]


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix [len(a), len(b)] of (left, top, right, bottom) boxes, right / bottom exclusive."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=2)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _matches(pred: np.ndarray, truth: np.ndarray, iou: float) -> int:
    """One-to-one matches between two box sets at IoU >= ``iou``, greedily by IoU (highest first)."""
    m = box_iou(pred, truth)
    pairs = sorted(((m[i, j], i, j) for i, j in zip(*np.nonzero(m >= iou))), reverse=True)
    used_p, used_t = set(), set()
    for _, i, j in pairs:
        if i not in used_p and j not in used_t:
            used_p.add(i)
            used_t.add(j)
    return len(used_p)


def _truth_boxes(truth) -> list[np.ndarray]:
    return [t.boxes if isinstance(t, ClickPage) else np.asarray(t) for t in truth]


def box_recall(pred: list[np.ndarray], truth, iou: float = 0.5) -> float:
    """Share of the true boxes (``ClickPage`` s or box arrays) matched one-to-one by a predicted box at IoU >=
    ``iou``, pooled over pages."""
    truth = _truth_boxes(truth)
    total = sum(len(t) for t in truth)
    return sum(_matches(p, t, iou) for p, t in zip(pred, truth, strict=True)) / max(total, 1)


def box_precision(pred: list[np.ndarray], truth, iou: float = 0.5) -> float:
    """Share of the predicted boxes matched one-to-one by a true box at IoU >= ``iou``, pooled over pages (1.0 when
    nothing is predicted)."""
    truth = _truth_boxes(truth)
    total = sum(len(p) for p in pred)
    return sum(_matches(p, t, iou) for p, t in zip(pred, truth, strict=True)) / total if total else 1.0


def box_agreement(reference: list[np.ndarray], other: list[np.ndarray], iou: float = 0.5) -> float:
    """Share of the reference run's boxes (the float model's) matched one-to-one by the other run's (a quantized
    model's) at IoU >= ``iou``, pooled over pages (1.0 when the reference found none)."""
    total = sum(len(r) for r in reference)
    return sum(_matches(o, r, iou) for r, o in zip(reference, other, strict=True)) / total if total else 1.0
