"""Labelled OCR data rendered with Pillow, and the three PP-OCR tasks (rapidocr_onnxruntime 1.4.4 models).

The pre- and post-processing reproduce rapidocr's own code (read from the installed wheel; not imported,
it needs opencv), with Pillow's bilinear resize standing in for ``cv2.resize``:

- recogniser (``ch_ppocr_rec/text_recognize.py``, ``ch_ppocr_rec/utils.py``, ``config.yaml`` Rec):
  ``resize_norm_img`` scales a line to height 48 and width ``ceil(48 * w / h)`` capped at the batch width
  (``int(48 * max_wh_ratio)``, at least 320), maps pixels to ``(p / 255 - 0.5) / 0.5`` and pads on the right
  with 0 (mid grey). The lines made here are all at most 320/48 wide, so every batch is [N, 3, 48, 320].
  ``CTCLabelDecode`` takes the character list from the model's ``character`` metadata
  (``OrtInferSession.get_character_list``: ``str.splitlines()``, 6623 entries), appends " " at the end and
  inserts "blank" at index 0 (6625 classes); decoding is greedy: argmax per step, repeats merged, index 0
  dropped.
- direction classifier (``ch_ppocr_cls/text_cls.py``, ``ch_ppocr_cls/utils.py``, config Cls): the same
  resize and normalisation into [3, 48, 192] (lines wider than 4:1 are squeezed to 192), label list
  ["0", "180"], argmax.
- detector (``ch_ppocr_det/text_detect.py``, ``ch_ppocr_det/utils.py``, config Det): ``DetPreProcess`` with
  ``limit_type: min``, ``limit_side_len: 736``: a page whose short side is under 736 is scaled up so that it
  is 736, then each side is rounded to a multiple of 32 (``round(side / 32) * 32``), and the pixels mapped
  to ``(p / 255 - 0.5) / 0.5``; the output probability map is binarised at ``thresh: 0.3`` (then
  ``box_thresh: 0.5``, ``unclip_ratio: 1.6``, ``use_dilation: true`` in the box post-processing).

Images are grey (the three channels equal), so rapidocr's BGR channel order does not matter.

Text: English words in three casings, numbers in several formats (prices, dates, times, decimals,
percentages) and ASCII punctuation, all in the recogniser's dictionary, with word spacing of 0.28-0.42 em.
Fonts: the DejaVu faces under /usr/share/fonts when present, plus Pillow's built-in scalable font
(``ImageFont.load_default(size=...)``); on a machine without DejaVu only the latter is used, so the data
(and figures) differ from machine to machine but not from run to run.

Metrics: recogniser exact match (ends stripped; spaces between words count) and character error rate;
classifier accuracy; detector IoU of binary maps (two runs against each other, or a run against the
ground-truth boxes shrunk as DB's training labels are) and IoU of the post-processed boxes (``det_boxes``,
rapidocr's ``DBPostProcess`` for horizontal text) against the ground-truth ink boxes.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from .models import Runner

REC_HEIGHT, REC_WIDTH = 48, 320
CLS_HEIGHT, CLS_WIDTH = 48, 192
DET_LIMIT_SIDE = 736
DET_THRESH = 0.3
DET_BOX_THRESH = 0.5
DET_UNCLIP_RATIO = 1.6
DB_SHRINK_RATIO = 0.4  # PaddleOCR's DB label maker (shrink_ratio of MakeShrinkMap)

# ---------------------------------------------------------------------------------------------- text

WORDS = """
the of and to in is it you that he was for on are with as his they be at one have this from or had by
word but what some we can out other were all there when up use your how said an each she which do their
time if will way about many then them write would like so these her long make thing see him two has look
more day could go come did number sound no most people my over know water than call first who may down
side been now find any new work part take get place made live where after back little only round man year
came show every good me give our under name very through just form sentence great think say help low
line differ turn cause much mean before move right boy old too same tell does set three want air well also
play small end put home read hand port large spell add even land here must big high such follow act why
ask men change went light kind off need house picture try us again animal point mother world near build
self earth father head stand own page should country found answer school grow study still learn plant
cover food sun four between state keep eye never last let thought city tree cross farm hard start might
story saw far sea draw left late run while press close night real life few north open seem together next
white children begin got walk example ease paper group always music those both mark often letter until
mile river car feet care second book carry took science eat room friend began idea fish mountain stop
once base hear horse cut sure watch color face wood main enough plain girl usual young ready above ever
red list though feel talk bird soon body dog family direct pose leave song measure door product black
short numeral class wind question happen complete ship area half rock order fire south problem piece told
knew pass since top whole king space heard best hour better true during hundred five remember step early
hold west ground interest reach fast verb sing listen six table travel less morning ten simple several
vowel toward war lay against pattern slow center love person money serve appear road map rain rule govern
pull cold notice voice unit power town fine certain fly fall lead cry dark machine note wait plan figure
star box noun field rest correct able pound done beauty drive stood contain front teach week final gave
green quick develop ocean warm free minute strong special mind behind clear tail produce fact street inch
multiply nothing course stay wheel full force blue object decide surface deep moon island foot system
busy test record boat common gold possible plane stead dry wonder laugh thousand ago ran check game shape
equate hot miss brought heat snow tire bring yes distant fill east paint language among
""".split()

_TRAILING = [",", ".", ":", ";", "!", "?"]
_MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


def _word(rng: np.random.Generator) -> str:
    word = WORDS[rng.integers(len(WORDS))]
    casing = rng.random()
    if casing < 0.22:
        word = word.capitalize()
    elif casing < 0.30:
        word = word.upper()
    return word


def _number(rng: np.random.Generator) -> str:
    kind = rng.integers(9)
    if kind == 0:
        return str(rng.integers(0, 100))
    if kind == 1:
        return str(rng.integers(100, 100000))
    if kind == 2:
        return f"${rng.integers(1, 1000)}.{rng.integers(0, 100):02d}"
    if kind == 3:
        return f"{rng.integers(1990, 2031)}-{rng.integers(1, 13):02d}-{rng.integers(1, 29):02d}"
    if kind == 4:
        return f"{rng.integers(0, 24):02d}:{rng.integers(0, 60):02d}"
    if kind == 5:
        return f"{rng.integers(0, 100)}.{rng.integers(0, 1000)}"
    if kind == 6:
        return f"{rng.integers(1, 100)}%"
    if kind == 7:
        return f"{rng.integers(1, 29)} {_MONTHS[rng.integers(12)]}"
    return f"No.{rng.integers(1, 500)}"


def _token(rng: np.random.Generator) -> str:
    roll = rng.random()
    token = _number(rng) if roll < 0.25 else _word(rng)
    decoration = rng.random()
    if decoration < 0.18:
        token += _TRAILING[rng.integers(len(_TRAILING))]
    elif decoration < 0.22:
        token = f"({token})"
    elif decoration < 0.25:
        token = f'"{token}"'
    elif decoration < 0.28 and roll >= 0.25:
        token = f"{token}-{_word(rng).lower()}"
    elif decoration < 0.30:
        token = f"{token}/{rng.integers(1, 10)}"
    return token


def random_text(rng: np.random.Generator, n_tokens: int) -> str:
    """``n_tokens`` words / numbers separated by single spaces."""
    return " ".join(_token(rng) for _ in range(n_tokens))


# --------------------------------------------------------------------------------------------- fonts

_DEJAVU_FACES = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSansCondensed.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSans-Oblique.ttf",
)
_FONT_ROOT = Path("/usr/share/fonts")


@functools.cache
def font_faces() -> tuple[str | None, ...]:
    """The faces the data is rendered with: DejaVu files found under /usr/share/fonts (when present) and
    ``None``, Pillow's built-in scalable font (``ImageFont.load_default(size=...)``)."""
    found: dict[str, str] = {}
    if _FONT_ROOT.is_dir():
        for file in sorted(_FONT_ROOT.rglob("DejaVu*.ttf")):
            found.setdefault(file.name, str(file))
    return tuple(found[name] for name in _DEJAVU_FACES if name in found) + (None,)


@functools.cache
def _font(face: str | None, size: int) -> ImageFont.FreeTypeFont:
    if face is None:
        font = ImageFont.load_default(size=size)
        if not isinstance(font, ImageFont.FreeTypeFont):
            raise RuntimeError("Pillow was built without FreeType: no scalable default font for the OCR corpus")
        return font
    return ImageFont.truetype(face, size)


def _pick_font(rng: np.random.Generator, low: int, high: int) -> ImageFont.FreeTypeFont:
    faces = font_faces()
    return _font(faces[rng.integers(len(faces))], int(rng.integers(low, high + 1)))


# ----------------------------------------------------------------------------------------- rendering


def _text_alpha(text: str, font: ImageFont.FreeTypeFont, word_gap: float | None = None) -> np.ndarray:
    """The text's anti-aliased coverage (0..255), cropped to its ink. With ``word_gap`` (pixels) the
    words are drawn one by one on a common baseline, that far apart, instead of with the font's space."""
    words = text.split(" ")
    if word_gap is None or len(words) == 1:
        words, word_gap = [text], 0.0
    left, top, right, bottom = font.getbbox(text)
    pad = 4
    width = int(sum(font.getlength(w) for w in words) + word_gap * (len(words) - 1)) + 2 * pad + font.size
    mask = Image.new("L", (width, bottom - top + 2 * pad), 0)
    draw = ImageDraw.Draw(mask)
    x = float(pad - min(left, 0))
    for w in words:
        draw.text((x, pad - top), w, fill=255, font=font)
        x += font.getlength(w) + word_gap
    box = mask.getbbox()
    return np.asarray(mask.crop(box) if box else mask, dtype=np.float32)


def _word_gap(font: ImageFont.FreeTypeFont, rng: np.random.Generator) -> float:
    """Word spacing of 0.28-0.42 em (typeset text's range), or the font's own space when wider (mono).
    Pillow's built-in font has a 0.225 em space, which the recogniser often misses next to digits."""
    return max(font.getlength(" "), rng.uniform(0.28, 0.42) * font.size)


def _compose(alpha: np.ndarray, fg: float, bg: np.ndarray, noise: float, rng: np.random.Generator) -> np.ndarray:
    """Grey ink ``fg`` over background ``bg`` (same shape as alpha) plus Gaussian noise, as uint8."""
    a = alpha / 255.0
    img = bg * (1.0 - a) + fg * a + rng.normal(0.0, noise, alpha.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def _background(shape: tuple[int, int], level: float, rng: np.random.Generator) -> np.ndarray:
    """A flat grey level with a mild linear gradient (up to +-8 grey levels across the image)."""
    h, w = shape
    gy, gx = rng.uniform(-8, 8, 2)
    yy = np.linspace(-0.5, 0.5, h)[:, None]
    xx = np.linspace(-0.5, 0.5, w)[None, :]
    return level + gy * yy + gx * xx


def render_line(text: str, rng: np.random.Generator, *, size: tuple[int, int] = (22, 44)) -> np.ndarray:
    """One text line as a grey uint8 [H, W] image: a random face and size, word spacing of 0.28-0.42 em,
    ink 0-90 on background 175-255, margins of 0.1-0.4 x the font size above / below and 0.1-0.6 x on the
    sides (as the detector's unclipped boxes leave), a mild gradient, sometimes a slight blur (radius 0.6),
    noise sigma 1.5-6."""
    font = _pick_font(rng, *size)
    alpha = _text_alpha(text, font, _word_gap(font, rng))
    if rng.random() < 0.25:
        alpha = np.asarray(Image.fromarray(alpha.astype(np.uint8)).filter(ImageFilter.GaussianBlur(0.6)), np.float32)
    s = font.size
    top, bottom = (int(round(v * s)) for v in rng.uniform(0.1, 0.4, 2))
    left, right = (int(round(v * s)) for v in rng.uniform(0.1, 0.6, 2))
    h, w = alpha.shape
    canvas = np.zeros((h + top + bottom, w + left + right), np.float32)
    canvas[top : top + h, left : left + w] = alpha
    bg = _background(canvas.shape, rng.uniform(175, 255), rng)
    return _compose(canvas, rng.uniform(0, 90), bg, rng.uniform(1.5, 6.0), rng)


def _line_fitting(rng: np.random.Generator, max_ratio: float, tokens: tuple[int, int], size: tuple[int, int]):
    """Draw a text of ``tokens`` tokens and render it; drop tokens from the end until the image's width /
    height is at most ``max_ratio``."""
    while True:
        words = random_text(rng, int(rng.integers(tokens[0], tokens[1] + 1))).split(" ")
        while words:
            text = " ".join(words)
            img = render_line(text, rng, size=size)
            if img.shape[1] / img.shape[0] <= max_ratio:
                return text, img
            words.pop()


# --------------------------------------------------------------------------------------- preprocessing


def _to_chw(img: np.ndarray) -> np.ndarray:
    """uint8 grey [H, W] (or [H, W, 3]) -> float32 [3, H, W] in [-1, 1] (rapidocr: /255, -0.5, /0.5)."""
    x = img.astype(np.float32) / 255.0
    x = (x - 0.5) / 0.5
    if x.ndim == 2:
        return np.broadcast_to(x, (3, *x.shape)).copy()
    return x.transpose(2, 0, 1).copy()


def _resize(img: np.ndarray, width: int, height: int) -> np.ndarray:
    """Bilinear resize of a uint8 grey image with Pillow (rapidocr uses cv2.resize, INTER_LINEAR)."""
    return np.asarray(Image.fromarray(img).resize((width, height), Image.Resampling.BILINEAR))


def resize_norm_line(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """rapidocr's ``resize_norm_img`` (recogniser and classifier): height ``height``, width
    ``ceil(height * w / h)`` capped at ``width``, normalised, right-padded with zeros to ``width``."""
    h, w = img.shape[:2]
    resized_w = min(width, int(math.ceil(height * w / float(h))))
    out = np.zeros((3, height, width), np.float32)
    out[:, :, :resized_w] = _to_chw(_resize(img, resized_w, height))
    return out


def det_resized_shape(h: int, w: int, limit_side_len: int = DET_LIMIT_SIDE) -> tuple[int, int]:
    """rapidocr's ``DetPreProcess.resize`` target (limit_type "min"): scale up so that the short side is
    ``limit_side_len`` (never down), then round each side to a multiple of 32."""
    ratio = float(limit_side_len) / min(h, w) if min(h, w) < limit_side_len else 1.0
    rh, rw = int(h * ratio), int(w * ratio)
    return int(round(rh / 32) * 32), int(round(rw / 32) * 32)


def det_preprocess(img: np.ndarray) -> np.ndarray:
    """A page (uint8 grey [H, W]) -> float32 [1, 3, H', W'] as rapidocr's detector feeds it."""
    rh, rw = det_resized_shape(*img.shape[:2])
    return _to_chw(_resize(img, rw, rh))[None]


# -------------------------------------------------------------------------------------- recogniser


@functools.cache
def rec_characters(model_file: str | None = None) -> tuple[str, ...]:
    """The recogniser's class list, built as rapidocr's ``CTCLabelDecode.get_character`` builds it: the
    model's ``character`` metadata split with ``str.splitlines()``, then " " appended and "blank" inserted
    at index 0. Index 0 is the CTC blank, the last index (6624) the space."""
    if model_file is None:
        from .models import path

        model_file = str(path("ocr_rec"))
    try:
        import onnx

        proto = onnx.load(model_file, load_external_data=False)
        meta = {p.key: p.value for p in proto.metadata_props}
    except ImportError:
        import onnxruntime as ort

        meta = ort.InferenceSession(model_file, providers=["CPUExecutionProvider"]).get_modelmeta().custom_metadata_map
    chars = meta["character"].splitlines()
    return ("blank", *chars, " ")


def ctc_decode_indices(indices: np.ndarray, characters: tuple[str, ...] | list[str]) -> list[str]:
    """Greedy CTC: per row of class indices [N, T], merge runs of the same index, drop blanks (index 0),
    map to characters."""
    indices = np.asarray(indices)
    texts = []
    for row in indices:
        keep = np.ones(row.shape, bool)
        keep[1:] = row[1:] != row[:-1]
        keep &= row != 0
        texts.append("".join(characters[i] for i in row[keep]))
    return texts


def ctc_greedy_decode(probs: np.ndarray, characters: tuple[str, ...] | list[str]) -> list[str]:
    """Greedy CTC decoding of [N, T, C] class scores (argmax per step, then ``ctc_decode_indices``)."""
    probs = np.asarray(probs)
    if probs.shape[-1] != len(characters):
        raise ValueError(f"{probs.shape[-1]} classes but {len(characters)} characters")
    return ctc_decode_indices(probs.argmax(axis=-1), characters)


@dataclass(frozen=True)
class RecData:
    images: np.ndarray  # float32 [N, 3, 48, 320], preprocessed
    labels: tuple[str, ...]
    raw: tuple[np.ndarray, ...]  # the rendered uint8 lines before preprocessing

    def __len__(self) -> int:
        return len(self.labels)


def make_rec_data(n: int = 150, seed: int = 20240601) -> RecData:
    """``n`` single text lines of 1-5 tokens (at most 320/48 wide, so none is squeezed), preprocessed for
    the recogniser, with their texts."""
    rng = np.random.default_rng(seed)
    labels, raw = [], []
    for _ in range(n):
        text, img = _line_fitting(rng, REC_WIDTH / REC_HEIGHT, (1, 5), (22, 44))
        labels.append(text)
        raw.append(img)
    images = np.stack([resize_norm_line(img, REC_HEIGHT, REC_WIDTH) for img in raw])
    return RecData(images, tuple(labels), tuple(raw))


# ------------------------------------------------------------------------------ the held-out split
#
# Lines that no default or threshold of qlinear was chosen on: other faces (the Liberation, GNU FreeFont and URW
# base-35 families: Debian's fonts-liberation2, fonts-freefont-ttf and fonts-urw-base35, which .ci/run installs),
# other words, Chinese lines where a CJK face is present (WenQuanYi Micro Hei, fonts-wqy-microhei), and wider
# ranges of size, ink contrast, blur, noise and length than the corpus data. `tests/corpus/test_corpus_heldout.py`
# measures the default static int8 recogniser on it; nothing is tuned on it.

HELDOUT_WORDS = """
abstract accident advice agency airport alcohol amazing analysis ancient angle anxiety apartment argument
arrival article attempt attitude audience autumn average balance balloon bamboo barrier battery beneath
bicycle biology blanket bottle boundary bracket breakfast brilliant budget cabinet calendar campaign
candidate capacity capital carbon careful ceiling century chamber channel chapter charity chemical chicken
circuit climate cluster coastal coffee collect comfort command complex concert conduct confirm contract
copper corner cottage council counter courage crystal culture cushion customer dancing database daughter
decade defence delivery density deposit desert detail diamond digital dinner display distance division
doctor domestic donkey dozen drawing driver eastern economy editor elbow element elephant emergency empire
energy engine episode equation evening evidence exact exhibit extract factory fashion feather festival
fiction finance finger flavour flight forest fortune fountain freedom frozen gallery garden gasoline general
genuine glacier global golden grammar granite gravity guitar habitat harbour harvest heavy helmet highway
history holiday horizon hospital hunger husband identity image income infant initial insect instance
invoice island jacket journal journey justice kettle kingdom kitchen label ladder lantern laptop lecture
legend lemon leopard liberty library license lizard lobster lumber machine magnet mammal manager marble
margin market meadow measure medicine melody member mercury message method midnight mineral mirror mission
monitor monkey morning mortgage motion mountain museum mystery napkin narrow nation native network neutral
nickel notebook novel nuclear number obvious ocean office olive opinion orange orbit orchard organic oxygen
package palace panel parade parcel parking partner passage patient pattern pebble pencil pepper permit
person phrase physics picnic pigeon planet plastic pocket poetry police portrait potato powder prairie
premium pretty printer private problem process profit program project promise protein public pumpkin
puzzle quarter question rabbit radius railway random reason record reflect region remote rescue resource
ribbon rocket rubber saddle salmon sample satellite scissors season secret segment seminar sentence shadow
shelter silver simple sketch slogan soldier source spinach spirit stadium station statue strategy stream
student studio subject summit sunset surface symbol system tablet teacher tennis theory ticket timber
tomato tongue tractor traffic transfer treasure triangle tribute trophy tunnel turtle umbrella uniform
valley vampire vapour velvet venture version village vintage violin visitor volcano voyage wallet walnut
warrior weather wedding welcome whisper window winter witness wizard wonder yellow yogurt zebra
""".split()
HELDOUT_WORDS = [word for word in HELDOUT_WORDS if word not in set(WORDS)]  # none of the corpus' words

_HELDOUT_FACE_FILES = (
    "truetype/liberation2/LiberationSans-Regular.ttf", "truetype/liberation2/LiberationSans-Bold.ttf",
    "truetype/liberation2/LiberationSerif-Regular.ttf", "truetype/liberation2/LiberationSerif-Italic.ttf",
    "truetype/liberation2/LiberationMono-Regular.ttf", "truetype/liberation2/LiberationSansNarrow-Regular.ttf",
    "truetype/freefont/FreeSans.ttf", "truetype/freefont/FreeSerif.ttf", "truetype/freefont/FreeMono.ttf",
    "truetype/freefont/FreeSansBoldOblique.ttf", "truetype/freefont/FreeSerifBoldItalic.ttf",
    "opentype/urw-base35/NimbusSans-Regular.otf", "opentype/urw-base35/NimbusRoman-Regular.otf",
    "opentype/urw-base35/C059-Roman.otf", "opentype/urw-base35/P052-Italic.otf",
    "opentype/urw-base35/URWBookman-Light.otf", "opentype/urw-base35/URWGothic-Book.otf",
    "opentype/urw-base35/NimbusMonoPS-Regular.otf", "opentype/urw-base35/NimbusSansNarrow-Bold.otf",
)
_CJK_FACE_FILES = ("truetype/wqy/wqy-microhei.ttc",)


def installed_faces(files) -> tuple[str, ...]:
    """The font files of ``files`` (paths under /usr/share/fonts) that are installed, in that order."""
    return tuple(str(_FONT_ROOT / f) for f in files if (_FONT_ROOT / f).is_file())


@functools.cache
def heldout_faces() -> tuple[str, ...]:
    """The held-out split's Latin faces found under /usr/share/fonts (none of them renders the corpus data)."""
    return installed_faces(_HELDOUT_FACE_FILES)


@functools.cache
def cjk_face() -> str | None:
    """WenQuanYi Micro Hei (fonts-wqy-microhei), for Chinese lines and glyphs, or None."""
    return next(iter(installed_faces(_CJK_FACE_FILES)), None)


@functools.cache
def _common_chinese() -> tuple[str, ...]:
    """The recogniser dictionary's CJK ideographs among its first 3000 entries (the most common ones)."""
    return tuple(c for c in rec_characters()[1:3001] if "\u4e00" <= c <= "\u9fff")


def _heldout_token(rng: np.random.Generator) -> str:
    roll = rng.random()
    if roll < 0.2:
        return _number(rng)
    if roll < 0.27:  # a code: letters and digits (part numbers, flight numbers, postcodes)
        letters = "".join(chr(ord("A") + int(i)) for i in rng.integers(0, 26, int(rng.integers(1, 4))))
        return f"{letters}{'-' if rng.random() < 0.5 else ''}{rng.integers(10, 100000)}"
    word = HELDOUT_WORDS[rng.integers(len(HELDOUT_WORDS))]
    casing = rng.random()
    word = word.capitalize() if casing < 0.25 else word.upper() if casing < 0.35 else word
    if rng.random() < 0.15:
        word += _TRAILING[rng.integers(len(_TRAILING))]
    return word


def _heldout_text(rng: np.random.Generator) -> tuple[str, bool]:
    """(text, chinese): a Chinese line of 2-12 common characters (a fifth of the lines, where a CJK face is
    present), or 1-8 tokens of the held-out words, codes and numbers."""
    if cjk_face() is not None and rng.random() < 0.2:
        chars = _common_chinese()
        return "".join(chars[i] for i in rng.integers(0, len(chars), int(rng.integers(2, 13)))), True
    return " ".join(_heldout_token(rng) for _ in range(int(rng.integers(1, 9)))), False


def render_heldout_line(text: str, chinese: bool, rng: np.random.Generator) -> np.ndarray:
    """A held-out line: a held-out face at 16-60 px, ink 0-120 on background 140-255 (light on dark for a tenth
    of the lines), blur up to radius 1.2 on a third, noise sigma 0-10."""
    face = cjk_face() if chinese else heldout_faces()[rng.integers(len(heldout_faces()))]
    font = _font(face, int(rng.integers(16, 61)))
    alpha = _text_alpha(text, font, None if chinese else _word_gap(font, rng))
    if rng.random() < 0.33:
        blurred = Image.fromarray(alpha.astype(np.uint8)).filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 1.2)))
        alpha = np.asarray(blurred, np.float32)
    size = font.size
    top, bottom = (int(round(v * size)) for v in rng.uniform(0.05, 0.5, 2))
    left, right = (int(round(v * size)) for v in rng.uniform(0.05, 0.8, 2))
    h, w = alpha.shape
    canvas = np.zeros((h + top + bottom, w + left + right), np.float32)
    canvas[top : top + h, left : left + w] = alpha
    ink, level = rng.uniform(0, 120), rng.uniform(140, 255)
    if rng.random() < 0.1:
        ink, level = 255 - ink, 255 - level
    return _compose(canvas, ink, _background(canvas.shape, level, rng), rng.uniform(0.0, 10.0), rng)


def make_rec_heldout(n: int = 150, seed: int = 20261204) -> RecData:
    """``n`` held-out lines (at most 320/48 wide once tokens are dropped from the end), preprocessed for the
    recogniser. Needs the held-out faces (`heldout_faces`); raises FileNotFoundError without them."""
    if not heldout_faces():
        raise FileNotFoundError("no held-out faces under /usr/share/fonts (Debian: fonts-liberation2 "
                                "fonts-freefont-ttf fonts-urw-base35)")
    rng = np.random.default_rng(seed)
    labels, raw = [], []
    while len(labels) < n:
        text, chinese = _heldout_text(rng)
        parts = list(text) if chinese else text.split(" ")
        while parts:
            text = "".join(parts) if chinese else " ".join(parts)
            img = render_heldout_line(text, chinese, rng)
            if img.shape[1] / img.shape[0] <= REC_WIDTH / REC_HEIGHT:
                labels.append(text)
                raw.append(img)
                break
            parts.pop()
    images = np.stack([resize_norm_line(img, REC_HEIGHT, REC_WIDTH) for img in raw])
    return RecData(images, tuple(labels), tuple(raw))


@dataclass(frozen=True)
class RecResult:
    texts: list[str]
    indices: np.ndarray  # int [N, T], argmax per step
    confidence: np.ndarray  # float32 [N, T], max probability per step


def run_rec(run: Runner, data: RecData, *, batch: int = 16, characters: tuple[str, ...] | None = None) -> RecResult:
    """Recognise every line (batches of ``batch``) and decode greedily."""
    characters = rec_characters() if characters is None else characters
    indices, confidence = [], []
    for start in range(0, len(data), batch):
        probs = np.asarray(run({"x": data.images[start : start + batch]})[0])
        if probs.shape[-1] != len(characters):
            raise ValueError(f"recogniser gave {probs.shape[-1]} classes, the dictionary has {len(characters)}")
        indices.append(probs.argmax(axis=-1))
        confidence.append(probs.max(axis=-1).astype(np.float32))
    idx = np.concatenate(indices)
    return RecResult(ctc_decode_indices(idx, characters), idx, np.concatenate(confidence))


def exact_match(texts: list[str] | tuple[str, ...], labels: list[str] | tuple[str, ...]) -> float:
    """Fraction of texts equal to their labels once leading and trailing spaces are stripped: the
    recogniser often reads a line's blank margin as a space (the labels have none at the ends); spaces
    between words count. Most of the float model's misses are dropped spaces next to digits or
    punctuation ("12:30 Heat" -> "12:30Heat"), a trait of the Chinese-trained PP-OCRv4 model: on the
    default data it scores ~93% here and ~98.7% with all spaces removed (PaddleOCR's own RecMetric
    ignores spaces by default)."""
    if len(texts) != len(labels):
        raise ValueError(f"{len(texts)} texts for {len(labels)} labels")
    return float(np.mean([t.strip(" ") == lab for t, lab in zip(texts, labels)]))


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions of one character cost 1)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def char_error_rate(texts, labels) -> float:
    """Total edit distance (texts stripped of leading / trailing spaces, as in ``exact_match``) over total
    label length."""
    total = sum(len(lab) for lab in labels)
    return sum(edit_distance(t.strip(" "), lab) for t, lab in zip(texts, labels, strict=True)) / max(total, 1)


# -------------------------------------------------------------------------------------- classifier


@dataclass(frozen=True)
class ClsData:
    images: np.ndarray  # float32 [N, 3, 48, 192], preprocessed
    labels: np.ndarray  # int64 [N]: 0 upright, 1 rotated 180 degrees

    def __len__(self) -> int:
        return len(self.labels)


def make_cls_data(n: int = 200, seed: int = 20240602) -> ClsData:
    """``n`` text lines of 1-4 tokens (width / height up to 6.5; wider than 4 are squeezed into 192 as
    rapidocr does), half of them (at random positions) rotated by 180 degrees (label 1)."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % 2).astype(np.int64)
    images = []
    for label in labels:
        _, img = _line_fitting(rng, 6.5, (1, 4), (20, 44))
        if label:
            img = img[::-1, ::-1]  # cv2.rotate(img, ROTATE_180)
        images.append(resize_norm_line(np.ascontiguousarray(img), CLS_HEIGHT, CLS_WIDTH))
    return ClsData(np.stack(images), labels)


def run_cls(run: Runner, data: ClsData, *, batch: int = 64) -> np.ndarray:
    """The classifier's probabilities [N, 2] (column 0: upright, 1: rotated 180 degrees)."""
    return np.concatenate([np.asarray(run({"x": data.images[s : s + batch]})[0]) for s in range(0, len(data), batch)])


def cls_accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.asarray(probs).argmax(axis=1) == np.asarray(labels)))


# ---------------------------------------------------------------------------------------- detector


@dataclass(frozen=True)
class DetPage:
    image: np.ndarray  # uint8 grey [H, W], the page as rendered
    x: np.ndarray  # float32 [1, 3, H', W'], preprocessed (H', W' multiples of 32)
    boxes: np.ndarray  # float [K, 4]: each line's ink box (left, top, right, bottom) in page pixels
    texts: tuple[str, ...]

    def gt_mask(self, shrink: bool = True) -> np.ndarray:
        """The ground-truth text mask at the model's resolution [H', W']: each line's ink box scaled to
        the preprocessed size, and by default shrunk as DB's training labels are (the probability map
        marks the shrunk "kernel" of each text box; rapidocr grows the detected regions back by
        ``unclip_ratio``): offset ``D = A (1 - r^2) / L`` with r = 0.4, A the box's area, L its
        perimeter."""
        h, w = self.image.shape
        rh, rw = self.x.shape[2:]
        mask = np.zeros((rh, rw), bool)
        for left, top, right, bottom in self.boxes:
            l, r = left * rw / w, right * rw / w
            t, b = top * rh / h, bottom * rh / h
            if shrink:
                bw, bh = r - l, b - t
                d = bw * bh * (1 - DB_SHRINK_RATIO**2) / (2 * (bw + bh))
                l, r, t, b = l + d, r - d, t + d, b - d
            mask[int(round(t)) : int(round(b)), int(round(l)) : int(round(r))] = True
        return mask


# page sizes (height, width) before preprocessing: all are scaled up (short side -> 736) and rounded
DET_PAGE_SIZES = ((480, 600), (552, 552), (600, 720), (520, 680))


def make_det_pages(n: int = 3, seed: int = 20240603) -> list[DetPage]:
    """``n`` pages with 5-10 text lines each at known positions: random faces and sizes (14-30 px at page
    scale, 1.2-1.5x that after preprocessing), left indents, line gaps of at least 0.8x the font size (so
    lines stay separate), ink 0-90 on background 170-255, noise sigma 1.5-5."""
    rng = np.random.default_rng(seed)
    pages = []
    for i in range(n):
        h, w = DET_PAGE_SIZES[i % len(DET_PAGE_SIZES)]
        alpha = np.zeros((h, w), np.float32)
        boxes, texts = [], []
        y = int(rng.integers(10, 40))
        for _ in range(int(rng.integers(5, 11))):
            font = _pick_font(rng, 14, 30)
            x0 = int(rng.integers(10, w // 4))
            gap = _word_gap(font, rng)
            words = random_text(rng, int(rng.integers(1, 8))).split(" ")
            line = _text_alpha(" ".join(words), font, gap)
            while len(words) > 1 and x0 + line.shape[1] > w - 10:
                words.pop()
                line = _text_alpha(" ".join(words), font, gap)
            text = " ".join(words)
            lh, lw = line.shape
            if y + lh > h - 10 or x0 + lw > w - 10:
                break
            alpha[y : y + lh, x0 : x0 + lw] = line
            boxes.append((x0, y, x0 + lw, y + lh))
            texts.append(text)
            y += lh + int(rng.uniform(0.8, 2.5) * font.size)
        bg = _background((h, w), rng.uniform(170, 255), rng)
        img = _compose(alpha, rng.uniform(0, 90), bg, rng.uniform(1.5, 5.0), rng)
        pages.append(DetPage(img, det_preprocess(img), np.array(boxes, float), tuple(texts)))
    return pages


def run_det(run: Runner, pages: list[DetPage]) -> list[np.ndarray]:
    """The detector's probability map [H', W'] for each page (one page per call: the sizes differ)."""
    return [np.asarray(run({"x": page.x})[0])[0, 0] for page in pages]


def mask_iou(a: list[np.ndarray] | np.ndarray, b: list[np.ndarray] | np.ndarray) -> float:
    """Intersection over union of boolean masks, pooled over pages (total intersection / total union);
    1.0 when both are empty."""
    if isinstance(a, np.ndarray):
        a, b = [a], [b]
    inter = sum(int(np.logical_and(x, y).sum()) for x, y in zip(a, b, strict=True))
    union = sum(int(np.logical_or(x, y).sum()) for x, y in zip(a, b, strict=True))
    return 1.0 if union == 0 else inter / union


def det_iou(probs_a: list[np.ndarray], probs_b: list[np.ndarray], thresh: float = DET_THRESH) -> float:
    """IoU of two runs' binary maps (probability > ``thresh``), pooled over pages."""
    return mask_iou([p > thresh for p in probs_a], [p > thresh for p in probs_b])


def det_boxes(prob: np.ndarray, thresh: float = DET_THRESH, box_thresh: float = DET_BOX_THRESH,
              unclip_ratio: float = DET_UNCLIP_RATIO) -> np.ndarray:
    """Text boxes (left, top, right, bottom) at the map's resolution from one probability map [H', W'],
    rapidocr's ``DBPostProcess`` for horizontal text: binarise at ``thresh``, dilate with a 2x2 kernel,
    take each connected region's bounding box (``minAreaRect`` of a horizontal region), drop it when its
    mean probability ("fast" score) is under ``box_thresh`` or its short side under 3, and grow it by
    ``D = A * unclip_ratio / L`` (A its area, L its perimeter) on every side."""
    from scipy import ndimage

    mask = ndimage.binary_dilation(prob > thresh, structure=np.ones((2, 2), bool))
    labels, _ = ndimage.label(mask)
    boxes = []
    for sl in ndimage.find_objects(labels):
        if sl is None:
            continue
        t, b, l, r = sl[0].start, sl[0].stop, sl[1].start, sl[1].stop
        bw, bh = r - l, b - t
        if min(bw, bh) < 3 or prob[t:b, l:r].mean() < box_thresh:
            continue
        d = bw * bh * unclip_ratio / (2 * (bw + bh))
        boxes.append((l - d, t - d, r + d, b + d))
    return np.array(boxes, float).reshape(-1, 4)


def boxes_mask(boxes: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    mask = np.zeros(shape, bool)
    for l, t, r, b in boxes:
        mask[max(int(round(t)), 0) : max(int(round(b)), 0), max(int(round(l)), 0) : max(int(round(r)), 0)] = True
    return mask


def det_box_iou(probs: list[np.ndarray], pages: list[DetPage]) -> float:
    """IoU of the detected boxes (``det_boxes``, rapidocr's post-processing) against the pages' ink boxes,
    as masks at the model's resolution, pooled over pages."""
    return mask_iou([boxes_mask(det_boxes(p), p.shape) for p in probs], [page.gt_mask(shrink=False) for page in pages])


def det_gt_iou(probs: list[np.ndarray], pages: list[DetPage], thresh: float = DET_THRESH, shrink: bool = True) -> float:
    """IoU of a run's binary maps against the pages' ground-truth text masks (``DetPage.gt_mask``)."""
    return mask_iou([p > thresh for p in probs], [page.gt_mask(shrink) for page in pages])
