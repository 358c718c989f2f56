#!/usr/bin/env python3
"""Independent tokenizer reference for GGUF vocabularies.

  tokenizer_ref.py --model M --text "..."      # prints {"ids": [...]}  (no BOS added)
  tokenizer_ref.py --model M --decode 1,2,3    # prints {"text": "..."}

`tokenizer.ggml.model == "llama"` (SentencePiece, e.g. Gemma): a SentencePiece ModelProto is built
from the GGUF vocabulary and encoding is done by the `sentencepiece` package.
`tokenizer.ggml.model == "gpt2"` (byte-level BPE, e.g. Llama 3, Qwen): a small BPE written here.
In both, control and user-defined tokens written literally in the text are matched first
(leftmost, longest) and map straight to their ids. The conventions are in README.md.
"""

from __future__ import annotations

import sys

import argparse
import json

from ggufread import GGUFFile, GGUFFormatError


# GGUF token types (same numbering as SentencePiece's ModelProto.SentencePiece.Type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Pre-tokenizer regexes of byte-level BPE vocabularies, keyed by `tokenizer.ggml.pre`.
_GPT2_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_LLAMA3_PAT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_QWEN2_PAT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
PRE_TOKENIZERS = {
    "default": _GPT2_PAT,
    "gpt2": _GPT2_PAT,
    "llama-bpe": _LLAMA3_PAT,
    "llama3": _LLAMA3_PAT,
    "qwen2": _QWEN2_PAT,
    "qwen3": _QWEN2_PAT,
}
# Llama 3's tokenizer emits a whole pre-token directly when it is itself in the vocabulary.
IGNORE_MERGES = {"llama-bpe", "llama3"}


class TokenizerError(Exception):
    """A vocabulary or input this reference cannot handle, with the reason and the fix."""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


class Vocab:
    def __init__(self, path: str):
        try:
            f = GGUFFile(path).fields
        except FileNotFoundError:
            raise TokenizerError(f"model file {path!r} does not exist; pass an existing .gguf")
        except (GGUFFormatError, ValueError) as e:
            raise TokenizerError(f"cannot parse {path!r} as GGUF ({e})")

        def get(key, default=None):
            return f.get(key, default)

        self.model = get("tokenizer.ggml.model")
        if self.model is None:
            raise TokenizerError(f"{path} has no tokenizer.ggml.model; it carries no tokenizer")
        self.pre = get("tokenizer.ggml.pre", "default")
        self.tokens: list[str] = get("tokenizer.ggml.tokens")
        if not self.tokens:
            raise TokenizerError(f"{path} has no tokenizer.ggml.tokens")
        n = len(self.tokens)
        self.types: list[int] = get("tokenizer.ggml.token_type") or [NORMAL] * n
        self.scores: list[float] = get("tokenizer.ggml.scores") or [0.0] * n
        self.merges: list[str] = get("tokenizer.ggml.merges") or []
        self.bos = get("tokenizer.ggml.bos_token_id")
        self.eos = get("tokenizer.ggml.eos_token_id")
        self.unk = get("tokenizer.ggml.unknown_token_id")
        self.pad = get("tokenizer.ggml.padding_token_id")
        # Absent key: SentencePiece's own default (and llama.cpp's) is to add the dummy prefix.
        self.add_space_prefix = bool(get("tokenizer.ggml.add_space_prefix", self.model == "llama"))
        self.id_of = {}
        for i, t in enumerate(self.tokens):
            self.id_of.setdefault(t, i)


# --------------------------------------------------------------------------------------------
# Special-token splitting (shared by both vocabulary kinds)
# --------------------------------------------------------------------------------------------


def split_specials(text: str, vocab: Vocab) -> list[tuple[str, int | None]]:
    """Split text into (fragment, None) plain parts and (text, id) control/user-defined tokens.

    Matching is leftmost-first and, at one position, longest-first.
    """
    specials = {}
    for i, (t, ty) in enumerate(zip(vocab.tokens, vocab.types)):
        if ty in (CONTROL, USER_DEFINED) and t:
            specials.setdefault(t, i)
    if not specials:
        return [(text, None)] if text else []
    by_first: dict[str, list[str]] = {}
    for t in sorted(specials, key=len, reverse=True):
        by_first.setdefault(t[0], []).append(t)
    out: list[tuple[str, int | None]] = []
    start = i = 0
    while i < len(text):
        hit = None
        for cand in by_first.get(text[i], ()):
            if text.startswith(cand, i):
                hit = cand
                break
        if hit is None:
            i += 1
            continue
        if start < i:
            out.append((text[start:i], None))
        out.append((hit, specials[hit]))
        i += len(hit)
        start = i
    if start < len(text):
        out.append((text[start:], None))
    return out


# --------------------------------------------------------------------------------------------
# SentencePiece ("llama") vocabularies
# --------------------------------------------------------------------------------------------


class SentencePieceTokenizer:
    def __init__(self, vocab: Vocab):
        try:
            import sentencepiece as spm
            from sentencepiece import sentencepiece_model_pb2 as pb
        except ImportError as e:
            raise TokenizerError(f"{e}; install tests/reference/requirements.txt (sentencepiece, protobuf)")
        self.vocab = vocab
        proto = pb.ModelProto()
        unk = vocab.unk if vocab.unk is not None else vocab.id_of.get("<unk>")
        if unk is None:
            raise TokenizerError("SentencePiece vocabulary without an unknown token id")
        for i, (piece, score, ty) in enumerate(zip(vocab.tokens, vocab.scores, vocab.types)):
            sp = proto.pieces.add()
            sp.piece = piece
            sp.score = float(score)
            # SentencePiece needs exactly one UNKNOWN piece; GGUF files often mark <unk> CONTROL.
            if i == unk:
                sp.type = UNKNOWN
            elif ty in (NORMAL, CONTROL, USER_DEFINED, UNUSED, BYTE):
                sp.type = ty
            else:
                sp.type = NORMAL
        ts = proto.trainer_spec
        ts.model_type = pb.TrainerSpec.BPE
        ts.vocab_size = len(vocab.tokens)
        ts.byte_fallback = True
        ts.unk_id = unk
        ts.bos_id = vocab.bos if vocab.bos is not None else -1
        ts.eos_id = vocab.eos if vocab.eos is not None else -1
        ts.pad_id = vocab.pad if vocab.pad is not None else -1
        ts.unk_piece = vocab.tokens[unk]
        if vocab.bos is not None:
            ts.bos_piece = vocab.tokens[vocab.bos]
        if vocab.eos is not None:
            ts.eos_piece = vocab.tokens[vocab.eos]
        if vocab.pad is not None:
            ts.pad_piece = vocab.tokens[vocab.pad]
        ns = proto.normalizer_spec
        ns.name = "identity"
        ns.add_dummy_prefix = vocab.add_space_prefix
        ns.remove_extra_whitespaces = False
        ns.escape_whitespaces = True
        self.sp = spm.SentencePieceProcessor()
        self.sp.LoadFromSerializedProto(proto.SerializeToString())

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for frag, special in split_specials(text, self.vocab):
            if special is not None:
                ids.append(special)
            else:
                ids.extend(self.sp.EncodeAsIds(frag))
        return ids

    def decode(self, ids: list[int]) -> str:
        out = bytearray()
        for i in ids:
            piece = self.vocab.tokens[i]
            if self.vocab.types[i] == BYTE:
                out.append(int(piece[3:-1], 16))  # "<0xAB>"
            else:
                out += piece.replace("\u2581", " ").encode("utf-8")
        text = out.decode("utf-8", errors="replace")
        if self.vocab.add_space_prefix and text.startswith(" "):
            text = text[1:]
        return text


# --------------------------------------------------------------------------------------------
# Byte-level BPE ("gpt2") vocabularies
# --------------------------------------------------------------------------------------------


class ByteLevelBPETokenizer:
    def __init__(self, vocab: Vocab):
        try:
            import regex
        except ImportError as e:
            raise TokenizerError(f"{e}; install tests/reference/requirements.txt (regex)")
        pat = PRE_TOKENIZERS.get(vocab.pre)
        if pat is None:
            raise TokenizerError(
                f"pre-tokenizer {vocab.pre!r} is unknown to this reference; known: {sorted(PRE_TOKENIZERS)}"
            )
        if not vocab.merges:
            raise TokenizerError("gpt2 vocabulary without tokenizer.ggml.merges")
        self.vocab = vocab
        self.pat = regex.compile(pat)
        self.ignore_merges = vocab.pre in IGNORE_MERGES
        self.ranks: dict[tuple[str, str], int] = {}
        for rank, m in enumerate(vocab.merges):
            parts = m.split(" ")
            if len(parts) != 2:
                raise TokenizerError(f"merge #{rank} {m!r} is not two space-separated symbols")
            self.ranks.setdefault((parts[0], parts[1]), rank)
        self.b2u = bytes_to_unicode()
        self.u2b = {u: b for b, u in self.b2u.items()}

    def bpe(self, word: str) -> list[str]:
        """Merge the lowest-ranked adjacent pair (all its non-overlapping occurrences, left to
        right) until no ranked pair remains."""
        if self.ignore_merges and word in self.vocab.id_of:
            return [word]
        syms = list(word)
        while len(syms) > 1:
            best = None
            for a, b in zip(syms, syms[1:]):
                r = self.ranks.get((a, b))
                if r is not None and (best is None or r < best[0]):
                    best = (r, a, b)
            if best is None:
                break
            _, a, b = best
            merged: list[str] = []
            i = 0
            while i < len(syms):
                if i + 1 < len(syms) and syms[i] == a and syms[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(syms[i])
                    i += 1
            syms = merged
        return syms

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for frag, special in split_specials(text, self.vocab):
            if special is not None:
                ids.append(special)
                continue
            for word in self.pat.findall(frag):
                mapped = "".join(self.b2u[b] for b in word.encode("utf-8"))
                for sym in self.bpe(mapped):
                    i = self.vocab.id_of.get(sym)
                    if i is None:
                        raise TokenizerError(f"BPE produced {sym!r}, which is not in the vocabulary")
                    ids.append(i)
        return ids

    def decode(self, ids: list[int]) -> str:
        out = bytearray()
        for i in ids:
            piece = self.vocab.tokens[i]
            if self.vocab.types[i] in (CONTROL, USER_DEFINED):
                out += piece.encode("utf-8")
            else:
                for ch in piece:
                    b = self.u2b.get(ch)
                    if b is None:  # not a byte-level symbol: take the character as UTF-8
                        out += ch.encode("utf-8")
                    else:
                        out.append(b)
        return out.decode("utf-8", errors="replace")


def load_tokenizer(path: str):
    vocab = Vocab(path)
    if vocab.model == "llama":
        return SentencePieceTokenizer(vocab)
    if vocab.model == "gpt2":
        return ByteLevelBPETokenizer(vocab)
    raise TokenizerError(f"tokenizer model {vocab.model!r} is not supported (only llama and gpt2)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="path to a .gguf file")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--text", help="text to encode (no BOS is added)")
    g.add_argument("--decode", help="comma-separated token ids to decode")
    args = ap.parse_args(argv)
    try:
        tok = load_tokenizer(args.model)
        if args.text is not None:
            print(json.dumps({"ids": tok.encode(args.text)}))
        else:
            try:
                ids = [int(x) for x in args.decode.replace(" ", "").split(",") if x != ""]
            except ValueError:
                raise TokenizerError(f"--decode {args.decode!r} is not a comma-separated list of integers")
            bad = [i for i in ids if not 0 <= i < len(tok.vocab.tokens)]
            if bad:
                raise TokenizerError(f"token ids {bad} are outside the vocabulary 0..{len(tok.vocab.tokens) - 1}")
            print(json.dumps({"text": tok.decode(ids)}))
    except TokenizerError as e:
        print(f"tokenizer_ref.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
