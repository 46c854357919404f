"""Text in and text out for models that carry their tokenizer (imported Hugging Face and
sentence-transformers checkpoints: :func:`protocols.model.load_tokenizer`), query-user side.

The user tokenizes locally with the checkpoint's own ``tokenizer.json`` - its normalizer,
pre-tokenizer, model and post-processor, so a BERT-style tokenizer adds [CLS] and [SEP]
itself; token types are 0 - embeds the ids with its tables and shares only the embedding;
for a model whose owner keeps the tables secret it shares the ids' one-hot rows instead.
Nothing is cut: a text longer than the model's ``max_len`` (special tokens included) is
refused with its token count (sentence-transformers would truncate it silently). Texts of
one token length go to the parties as one job (:func:`by_length`); generated ids are turned
back into text incrementally (:class:`TokenStream`).
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from protocols import model as M


def parse_ids(spec: str, vocab: int) -> list[int]:
    """``--ids 5,17,3`` -> [5, 17, 3], each in 0..vocab-1 (ValueError otherwise)."""
    try:
        ids = [int(t) for t in spec.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--ids {spec!r}: expected comma-separated integers") from None
    if not ids or min(ids) < 0 or max(ids) >= vocab:
        raise ValueError(f"--ids {spec!r}: expected token ids in 0..{vocab - 1}")
    return ids


def _short(text: str, n: int = 40) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


def token_ids(tokenizer, texts: Sequence[str], max_len: int) -> list[list[int]]:
    """Each text's token ids (the tokenizer's special tokens included), refusing empty
    texts and texts of more than ``max_len`` tokens - one line naming the text, its token
    count and max_len."""
    out = []
    for i, text in enumerate(texts):
        ids = tokenizer.encode(text).ids
        if not ids or not text.strip():
            raise ValueError(f"text {i + 1} is empty")
        if len(ids) > max_len:
            raise ValueError(f"text {i + 1} ({_short(text)}) is {len(ids)} tokens with its "
                             f"special tokens; the model takes at most {max_len} (max_len): "
                             f"shorten it")
        out.append(ids)
    return out


def by_length(seqs: Sequence[Sequence[int]]) -> dict[int, list[int]]:
    """Token length -> the indices of the sequences of that length (one job each)."""
    groups: dict[int, list[int]] = {}
    for i, s in enumerate(seqs):
        groups.setdefault(len(s), []).append(i)
    return groups


#: the job kind an encoder whose owner keeps its embedding tables secret runs instead of each
#: user-embedded one (protocols.stacks.secret_encoder: one-hot rows in)
SECRET_KINDS = {"classify": "classify_secret", "classify_argmax": "classify_argmax_secret",
                "embed": "embed_secret"}


def run_grouped(run: Callable[[np.ndarray], np.ndarray], cfg: M.ModelConfig,
                user: Mapping[str, np.ndarray], seqs: Sequence[Sequence[int]],
                secret: bool = False) -> np.ndarray:
    """One job per token length: ``run(X)`` with X (B, S, d) the embedded sequences of
    length S returns their rows (B, ...); the rows come back in the order of ``seqs``.
    ``secret``: X is instead their one-hot rows (B, S, V + Tv), token types 0
    (:func:`protocols.stacks.secret_encoder.encoder_onehot`), for a model whose owner keeps
    the embedding tables secret."""
    from protocols.stacks.secret_encoder import encoder_onehot
    out: list[np.ndarray | None] = [None] * len(seqs)
    for idx in by_length(seqs).values():
        ids = np.array([seqs[i] for i in idx])
        rows = run(encoder_onehot(ids, cfg) if secret else M.embed_tokens(cfg, user, ids))
        for i, row in zip(idx, rows):
            out[i] = row
    return np.stack(out)


class TokenStream:
    """Incremental text of generated token ids with the model's tokenizer: each
    :meth:`feed` returns the text that became final (a character split over several
    byte-level tokens appears once all of them are there); :meth:`flush` the rest.
    Special tokens are left out."""

    def __init__(self, tokenizer) -> None:
        self.tok, self.ids, self.shown = tokenizer, [], ""

    def _new(self, final: bool) -> str:
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        if not final:
            text = text.rstrip("\ufffd")          # an incomplete UTF-8 sequence so far
        if not text.startswith(self.shown):        # the decoder rewrote its tail: wait
            return ""
        new, self.shown = text[len(self.shown):], text
        return new

    def feed(self, tok: int) -> str:
        self.ids.append(int(tok))
        return self._new(False)

    def flush(self) -> str:
        return self._new(True)


def _a(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def model_inputs(path: str, arch: str, texts: Sequence[str] | None, ids, what: str):
    """(config, user tensors, token id sequences) of ``texts`` - or of one input given as
    token ``ids`` (a list, or the CLI's "5,17,3") - with the model file at ``path``, which
    must be an ``arch`` model holding its query-user tensors; ``what`` names the caller in
    errors (``embed``, ``classify``)."""
    from protocols.model import load_tokenizer

    from .cli.common import load_model_file
    mcfg, _, user = load_model_file(path)
    if mcfg.arch != arch:
        raise ValueError(f"{path} is {_a(mcfg.arch)} model; {what} needs {_a(arch)} model")
    if "embed.src" not in user:
        raise ValueError(f"{path} holds no query-user tensors (embed.src)")
    if bool(texts) == (ids is not None):
        raise ValueError("give texts or token ids, not both or neither")
    if ids is not None:
        seq = parse_ids(ids if isinstance(ids, str) else ",".join(map(str, ids)),
                        mcfg.src_vocab)
        if len(seq) > mcfg.max_len:
            raise ValueError(f"--ids: {len(seq)} tokens; the model takes at most "
                             f"{mcfg.max_len} (max_len)")
        return mcfg, user, [seq]
    tok = load_tokenizer(path)
    if tok is None:
        raise ValueError(f"{path} carries no tokenizer (imported without tokenizer.json): "
                         "pass token ids with --ids")
    return mcfg, user, token_ids(tok, texts, mcfg.max_len)


def lm_prompt(path: str, prompt: str | None, ids=None):
    """(config, user tensors, prompt ids, text stream or None, eos) of an LM prompt: text
    through the model file's tokenizer when it carries one, else UTF-8 bytes (then id 256
    ends the text when the vocabulary has it); or token ``ids`` (a list or "5,17,3"), whose
    output is shown as ids (stream None)."""
    from protocols.model import load_tokenizer

    from .cli.common import load_model_file
    from .generate import ByteStream, encode_text, eos_of
    mcfg, _, user = load_model_file(path)
    if mcfg.arch != "decoder-only":
        raise ValueError(f"{path} is {_a(mcfg.arch)} model; generate needs a decoder-only LM")
    if not user:
        raise ValueError(f"{path} holds no query-user tensors (embed.tgt, out.w, out.b)")
    if (prompt is None) == (ids is None):
        raise ValueError("give a text prompt or token ids, not both or neither")
    if ids is not None:
        seq = parse_ids(ids if isinstance(ids, str) else ",".join(map(str, ids)),
                        mcfg.tgt_vocab)
        return mcfg, user, seq, None, None
    tok = load_tokenizer(path)
    if tok is not None:
        return mcfg, user, token_ids(tok, [prompt], mcfg.max_len)[0], TokenStream(tok), None
    return mcfg, user, encode_text(mcfg, prompt), ByteStream(), eos_of(mcfg)
