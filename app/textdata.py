"""Self-generated seq2seq translation task: integers in digits -> English words.

Convention (the ground truth, :func:`reference_translation`):

* input: a canonical decimal integer in ``0 .. 999_999_999`` written with the
  characters ``0-9`` only (no sign, separators or leading zeros; surrounding
  whitespace is stripped);
* output: lower-case English words separated by single spaces, short scale,
  no "and", no hyphens, no commas: ``0 -> "zero"``, ``15 -> "fifteen"``,
  ``96 -> "ninety six"``, ``4096 -> "four thousand ninety six"``,
  ``1_000_000 -> "one million"``, ``700_010 -> "seven hundred thousand ten"``.

Tokenisation: source = one token per digit followed by ``<eos>`` (at most 10
tokens); target = word tokens followed by ``<eos>`` (at most 14 words + eos),
decoder input starts with ``<bos>``.  Special ids: ``<pad>=0, <bos>=1,
<eos>=2`` in both vocabularies.

Splits are disjoint by number: numbers < 100 (the pure lexicon) are train-only;
every number >= 100 is assigned to ``train`` / ``valid`` / ``test`` by a fixed
64-bit hash (:func:`split_of`; 80% / 10% / 10%).  ``sample_numbers`` draws the digit
count uniformly (1..9 for train, 3..9 for valid/test) then a uniform number
with that many digits, rejecting numbers of other splits.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PAD, BOS, EOS = 0, 1, 2
SPECIALS = ["<pad>", "<bos>", "<eos>"]
MAX_NUMBER = 999_999_999
MAX_DIGITS = 9
MAX_SRC_LEN = MAX_DIGITS + 1  # digits + <eos>
MAX_TGT_WORDS = 14
MAX_TGT_LEN = MAX_TGT_WORDS + 1  # words + <eos> (decoder input: <bos> + words)

ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
        "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
SCALES = ["hundred", "thousand", "million"]

SRC_TOKENS = SPECIALS + list("0123456789")
TGT_TOKENS = SPECIALS + ONES + TENS[2:] + SCALES
SPLITS = ("train", "valid", "test")
_CANON = re.compile(r"(0|[1-9][0-9]{0,8})")


# ------------------------------------------------------------------ ground truth


def _below_1000(n: int) -> list[str]:
    words = []
    if n >= 100:
        words += [ONES[n // 100], "hundred"]
        n %= 100
    if n >= 20:
        words.append(TENS[n // 10])
        n %= 10
        if n:
            words.append(ONES[n])
    elif n > 0:
        words.append(ONES[n])
    return words


def number_to_words(n: int) -> str:
    if not (0 <= n <= MAX_NUMBER):
        raise ValueError(f"number {n} outside 0..{MAX_NUMBER}")
    if n == 0:
        return "zero"
    words = []
    for div, name in ((1_000_000, "million"), (1_000, "thousand")):
        if n >= div:
            words += _below_1000(n // div) + [name]
            n %= div
    words += _below_1000(n)
    return " ".join(words)


def parse_src(text: str) -> int:
    if not isinstance(text, str):
        raise ValueError(f"source must be a str, got {type(text).__name__}")
    t = text.strip()
    bad = sorted({c for c in t if c not in "0123456789"})
    if bad:
        raise ValueError(f"source {text!r} contains characters outside the vocabulary: {bad}")
    if not t:
        raise ValueError("empty source")
    if len(t) > MAX_DIGITS:
        raise ValueError(f"source {text!r} is too long: {len(t)} digits > {MAX_DIGITS}")
    if not _CANON.fullmatch(t):
        raise ValueError(f"source {text!r} has leading zeros (not canonical)")
    return int(t)


def reference_translation(text: str) -> str:
    return number_to_words(parse_src(text))


# ------------------------------------------------------------------ vocab


@dataclass(frozen=True)
class Vocab:
    src: tuple = tuple(SRC_TOKENS)
    tgt: tuple = tuple(TGT_TOKENS)
    max_src_len: int = MAX_SRC_LEN
    max_tgt_len: int = MAX_TGT_LEN
    pad: int = PAD
    bos: int = BOS
    eos: int = EOS
    src_index: dict = field(default=None, compare=False, repr=False)
    tgt_index: dict = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "src_index", {t: i for i, t in enumerate(self.src)})
        object.__setattr__(self, "tgt_index", {t: i for i, t in enumerate(self.tgt)})

    def to_dict(self) -> dict:
        return {"task": "digits_to_english_words", "version": 1, "src": list(self.src),
                "tgt": list(self.tgt), "max_src_len": self.max_src_len,
                "max_tgt_len": self.max_tgt_len,
                "specials": {"pad": self.pad, "bos": self.bos, "eos": self.eos}}

    @classmethod
    def from_dict(cls, d: dict) -> "Vocab":
        s = d["specials"]
        return cls(src=tuple(d["src"]), tgt=tuple(d["tgt"]), max_src_len=int(d["max_src_len"]),
                   max_tgt_len=int(d["max_tgt_len"]), pad=int(s["pad"]), bos=int(s["bos"]),
                   eos=int(s["eos"]))

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path) -> "Vocab":
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


VOCAB = Vocab()


def encode_src(text: str, vocab: Vocab = VOCAB) -> list[int]:
    """Digits -> token ids + [<eos>]; ValueError on bad characters / too long."""
    t = str(parse_src(text))
    return [vocab.src_index[c] for c in t] + [vocab.eos]


def encode_tgt(words: str, vocab: Vocab = VOCAB) -> list[int]:
    """Target sentence -> word ids + [<eos>] (no <bos>)."""
    ids = []
    for wd in words.split():
        if wd not in vocab.tgt_index or vocab.tgt_index[wd] < len(SPECIALS):
            raise ValueError(f"word {wd!r} not in target vocabulary")
        ids.append(vocab.tgt_index[wd])
    if len(ids) > MAX_TGT_WORDS:
        raise ValueError(f"target too long: {len(ids)} words > {MAX_TGT_WORDS}")
    return ids + [vocab.eos]


def decode_tgt(ids, vocab: Vocab = VOCAB) -> str:
    """Word ids -> sentence; stops at <eos>, skips <pad>/<bos>."""
    out = []
    for i in ids:
        i = int(i)
        if i == vocab.eos:
            break
        if i in (vocab.pad, vocab.bos):
            continue
        if not 0 <= i < len(vocab.tgt):
            raise ValueError(f"target id {i} out of range")
        out.append(vocab.tgt[i])
    return " ".join(out)


# ------------------------------------------------------------------ splits


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def split_codes(nums) -> np.ndarray:
    """0 = train, 1 = valid, 2 = test (vectorised)."""
    n = np.atleast_1d(np.asarray(nums, dtype=np.int64))
    b = (_splitmix64(n ^ 0x5EED_7C25) % np.uint64(10)).astype(np.int64)
    code = np.where(b == 0, 2, np.where(b == 1, 1, 0))
    return np.where(n < 100, 0, code)


def split_of(n: int) -> str:
    return SPLITS[int(split_codes([n])[0])]


def sample_numbers(n: int, seed: int, split: str) -> np.ndarray:
    """n numbers of the given split (deterministic in (seed, split))."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    code = SPLITS.index(split)
    rng = np.random.default_rng([int(seed), code, 0xD161])
    lo_digits = 1 if split == "train" else 3
    out = []
    have = 0
    while have < n:
        m = max(2 * (n - have), 64)
        L = rng.integers(lo_digits, MAX_DIGITS + 1, size=m)
        lo = np.where(L == 1, 0, 10 ** (L - 1))
        hi = 10 ** L
        x = lo + (rng.random(m) * (hi - lo)).astype(np.int64)
        x = np.minimum(x, hi - 1)
        x = x[split_codes(x) == code]
        out.append(x)
        have += len(x)
    return np.concatenate(out)[:n]


# ------------------------------------------------------------------ shipped model


ASSETS = Path(__file__).resolve().parent / "assets"
SHIPPED_MODEL = ASSETS / "translator.npz"
SHIPPED_VOCAB = ASSETS / "vocab.json"
#: The shipped decoder-only LMs (benchmarks/train_lm.py), one per attention, all of one shape
#: and trained on the same generated text: byte tokens, "N = " -> N's words, id 256 ends it.
SHIPPED_LMS = {"relu-performer": ASSETS / "lm.npz", "softmax": ASSETS / "lm_softmax.npz",
               "power-softmax": ASSETS / "lm_power-softmax.npz",
               "sigma-relu": ASSETS / "lm_sigma-relu.npz"}
SHIPPED_LM = SHIPPED_LMS["relu-performer"]
#: The shipped encoder classifier (benchmarks/train_classifier.py): N's words as bytes padded
#: with :data:`CLASSIFIER_PAD` to :data:`CLASSIFIER_LEN` -> N's leading digit (10 classes).
SHIPPED_CLASSIFIER = ASSETS / "classifier.npz"
CLASSIFIER_PAD = 256
CLASSIFIER_LEN = 42          # len("seven thousand seven hundred seventy seven"), N < 10000


def leading_digit(n: int) -> int:
    """The shipped classifier's class of ``n``."""
    return int(str(int(n))[0])


def classifier_input(nums) -> np.ndarray:
    """(B, CLASSIFIER_LEN) byte ids of each number's words, padded with CLASSIFIER_PAD (the
    classifier has no padding mask: it is trained and run on these padded rows)."""
    ids = np.full((len(nums), CLASSIFIER_LEN), CLASSIFIER_PAD, dtype=np.int64)
    for b, n in enumerate(nums):
        text = number_to_words(int(n)).encode()
        if len(text) > CLASSIFIER_LEN:
            raise ValueError(f"{n}: {len(text)} bytes of words > {CLASSIFIER_LEN}")
        ids[b, :len(text)] = list(text)
    return ids


def load_shipped():
    """(cfg, weights, user, vocab) of the shipped translator (numpy only)."""
    from protocols import model as M

    cfg, w, user = M.load_model(SHIPPED_MODEL)
    vocab = Vocab.load(SHIPPED_VOCAB)
    if vocab != VOCAB:
        raise ValueError("shipped vocab.json differs from app.textdata.VOCAB")
    if (cfg.src_vocab, cfg.tgt_vocab) != (len(vocab.src), len(vocab.tgt)):
        raise ValueError("shipped model vocab sizes do not match vocab.json")
    if not user:
        raise ValueError("shipped model has no user (embedding/output) tensors")
    return cfg, w, user, vocab


def translate(texts, cfg, w, user, vocab: Vocab = VOCAB) -> list[str]:
    """Greedy translation with the numpy reference; groups inputs by length (no padding)."""
    from protocols import model as M

    ids = [encode_src(t, vocab) for t in texts]
    out: list[str | None] = [None] * len(ids)
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(ids):
        by_len.setdefault(len(s), []).append(i)
    for _, idx in sorted(by_len.items()):
        src = np.array([ids[i] for i in idx])
        dec = M.greedy_decode(cfg, w, user, src, vocab.bos, vocab.eos,
                              max_steps=vocab.max_tgt_len)
        for i, toks in zip(idx, dec):
            out[i] = decode_tgt(toks, vocab)
    return out


def calibration_samples(cfg, w, user, n: int = 64, seed: int = 0, vocab: Vocab = VOCAB):
    """Real inputs of the translator for :func:`protocols.calibration.calibrate.calibrate`: ``n``
    numbers of the train split (1 to 9 digits), their embedded sources grouped by length, each
    paired with the decoder inputs a real greedy decoding feeds - ``<bos>`` and then the model's own
    predictions for all ``max_len - 1`` further steps (a batched decoding keeps stepping rows
    that already emitted ``<eos>``), so the prefix sums reach their full size."""
    from protocols import model as M
    from protocols.calibration import calibrate as C

    by_len: dict[int, list[list[int]]] = {}
    for x in sample_numbers(n, seed, "train"):
        ids = encode_src(str(int(x)), vocab)
        by_len.setdefault(len(ids), []).append(ids)
    X, Y = [], []
    for _, rows in sorted(by_len.items()):
        src = M.embed(cfg, user["embed.src"], np.array(rows))
        enc = M.ref_encoder(cfg, w, src)
        state = M.RefDecodeState(cfg, w, enc)
        toks = np.full((len(rows), 1), vocab.bos, dtype=np.int64)
        for t in range(cfg.max_len - 1):
            y = M.embed(cfg, user["embed.tgt"], toks[:, -1:], offset=t)[:, 0, :]
            nxt = M.output_logits(user, M.ref_decoder_step(cfg, w, state, y)).argmax(-1)
            toks = np.concatenate([toks, nxt[:, None]], axis=1)
        X.append(src)
        Y.append(M.embed(cfg, user["embed.tgt"], toks))
    return C.Samples(X, Y)
