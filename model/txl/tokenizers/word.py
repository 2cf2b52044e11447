"""Word-level tokenizer of the Transformer-XL WikiText-103 model (Dai et al., 2019; HF `TransfoXLTokenizer`).

Encoding reproduces HF transformers 4.35.2 token for token: special tokens written in the text are cut out first,
then each piece goes through Moses punctuation normalisation, Moses tokenisation (hyphens split as `@-@`) and the
number split (`23,000` -> `23 @,@ 000`). HF encodes one line; here each `\\n` becomes one `<eos>` (the WikiText
convention, one per line), so a single line is exactly HF's encoding. A tokenizer converted from an HF directory
may carry HF's added-token table (`added.py`): its tokens are cut out of the text too, and its ids win over the
vocabulary's when text is encoded (decoding writes the vocabulary's symbol of an id).

Decoding undoes the tokenisation, and is designed so that `encode(decode(ids)) == ids` for WikiText text: the
text of a token is a separator (`""` or `" "`) plus its surface form, and the separator depends only on the
previous token, the open-quote parity of the line, the current Moses word, and for `.` and `'` on the next
token. Where a pretty join would be re-tokenised differently by Moses (`Mr.`, `"word",`), a space is kept.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import sacremoses

from .added import AddedToken
from .base import TOKENIZER_NAME, TokenizerError
from .hf_directory import read_hf_tokenizer

UNK, EOS, FORMULA = "<unk>", "<eos>", "<formula>"  # HF's defaults

# HF splits `,` and `.` between digits after Moses has kept `23,000` and `1.80` whole.
_NUMBER_SEPARATOR = re.compile(r"(?<=\d)[,.](?=\d)")
# How many context tokens a decoder replays to learn the current Moses word (at most 64 characters, see _word_end).
_CONTEXT_TOKENS = 64

# Moses character classes (Perl Unicode properties), so that decoding judges characters as Moses does.
_ALPHA = frozenset(sacremoses.MosesTokenizer.IsAlpha)
_LOWER = frozenset(sacremoses.MosesTokenizer.IsLower)
_DIGITS = frozenset(sacremoses.MosesTokenizer.IsN)
# Characters Moses keeps inside a word when it decides whether a final `.` is an abbreviation's.
_WORD_CHARS = frozenset(sacremoses.MosesTokenizer.IsAlnum) | {".", ","}

_SURFACE = {"@-@": "-", "@,@": ",", "@.@": "."}  # written with no space on either side
_JOINED = frozenset({*_SURFACE, "/"})
_ATTACH_LEFT = frozenset({",", ";", ":", "!", "?", ")", "]", "}", "%", "n't", "N'T", "”"})
_ATTACH_RIGHT = frozenset({"(", "[", "{", "“"})
_DOUBLE_QUOTES = frozenset('"“”„«»')  # all `"` once normalised
_CURRENCY = frozenset({"$", "£", "€", "¥", "₤", "#"})
_DOTS = re.compile(r"\.+")
_ASCII_DIGITS = frozenset("0123456789")


class WordTokenizer:
    """A fixed vocabulary of words; unknown words encode as `unk_token`."""

    def __init__(
        self,
        vocab: Sequence[str],
        *,
        unk_token: str = UNK,
        eos_token: str = EOS,
        additional_special_tokens: Sequence[str] = (FORMULA,),
        lower_case: bool = False,
        language: str = "en",
        added_tokens: Sequence[AddedToken] = (),
    ) -> None:
        self.vocab = list(vocab)
        self._ids = {sym: i for i, sym in enumerate(self.vocab)}
        if len(self._ids) != len(self.vocab):
            raise TokenizerError("the vocabulary lists a symbol twice")
        if "" in self._ids:
            raise TokenizerError("the vocabulary has an empty symbol")
        if unk_token not in self._ids:
            raise TokenizerError(f"the vocabulary has no unknown-word token {unk_token!r}")
        self.unk_token, self.eos_token = unk_token, eos_token
        self.additional_special_tokens = list(additional_special_tokens)
        self.lower_case, self.language = lower_case, language
        self.vocab_size = len(self.vocab)
        self.added_tokens = list(added_tokens)
        self._added = {t.content: t for t in self.added_tokens}
        if len(self._added) != len(self.added_tokens):
            raise TokenizerError("the added-token table lists a token twice")
        # An id past the vocabulary cannot reach the model: such a token is only cut out (see hf_directory.py).
        self._added_ids = {t.content: t.id for t in self.added_tokens if t.id < self.vocab_size}
        self.unk_id = self._ids[unk_token]
        self.eos_id: int | None = self._added_ids.get(eos_token, self._ids.get(eos_token))
        # HF's order (eos, unk, additional) is the order Moses protects them in.
        self.special_tokens = list(dict.fromkeys([eos_token, unk_token, *additional_special_tokens]))
        self._uncut = frozenset([*self.special_tokens, *self._added])  # pieces that Moses never sees
        # Longest first, as HF's trie matches; escaped where HF passes them to Moses as regexes (same for `<...>`).
        self._special_split = re.compile(
            "(" + "|".join(re.escape(s) for s in sorted(self._uncut, key=lambda s: (-len(s), s))) + ")"
        )
        # What HF's lower-casing skips: the special tokens, and added tokens but the non-normalised ordinary ones.
        kept_case = [
            *self.special_tokens,
            *(t.content for t in self.added_tokens if t.special or t.normalized),
        ]
        self._case_split = re.compile(
            "(" + "|".join(re.escape(s) for s in sorted(set(kept_case), key=lambda s: (-len(s), s))) + ")"
        )
        self._protected = [re.escape(s) for s in self.special_tokens]
        self._normalizer = sacremoses.MosesPunctNormalizer(language)
        self._moses = sacremoses.MosesTokenizer(language)
        self._abbreviations = frozenset(self._moses.NONBREAKING_PREFIXES)
        self._numeric_abbreviations = frozenset(self._moses.NUMERIC_ONLY_PREFIXES)

    # ---- vocabulary and JSON ----

    @classmethod
    def build_vocab(
        cls,
        corpus: Path | Iterable[str],
        *,
        special: Sequence[str] = (EOS,),
        min_freq: int = 0,
        max_size: int | None = None,
        lower_case: bool = False,
        **options: Any,
    ) -> WordTokenizer:
        """A vocabulary from already-tokenised text (a file, or lines), as the original `Vocab.build_vocab`:
        `special` first, then symbols by decreasing count (ties in first-seen order) while count >= min_freq.
        `options` are the other `WordTokenizer` arguments."""
        counts: Counter[str] = Counter()
        with corpus.open(encoding="utf-8") if isinstance(corpus, Path) else nullcontext(corpus) as lines:
            for line in lines:
                counts.update((line.lower() if lower_case else line).split())
        vocab = dict.fromkeys(special)  # an ordered set
        for sym, count in counts.most_common(max_size):
            if count < min_freq:
                break
            vocab.setdefault(sym)
        symbols = list(vocab)
        unk = options.get("unk_token", UNK)
        if unk not in vocab:  # HF could not encode an unknown word at all; give it an id after the specials
            symbols.insert(len(dict.fromkeys(special)), unk)
        return cls(symbols, lower_case=lower_case, **options)

    def to_json(self) -> dict:
        spec = {
            "type": "word",
            "vocab": self.vocab,
            "unk_token": self.unk_token,
            "eos_token": self.eos_token,
            "additional_special_tokens": self.additional_special_tokens,
            "lower_case": self.lower_case,
            "language": self.language,
        }
        if self.added_tokens:
            spec["added_tokens"] = [t.to_json() for t in self.added_tokens]
        return spec

    @classmethod
    def from_json(cls, spec: dict, base_dir: Path | None = None) -> WordTokenizer:
        """`base_dir` is where the spec was read; the vocabulary is inline, so it is only named in errors."""
        where = f" in {base_dir}" if base_dir is not None else ""
        vocab = spec.get("vocab")
        if not isinstance(vocab, list) or not all(isinstance(s, str) for s in vocab):
            raise TokenizerError(f"word tokenizer{where}: 'vocab' must be a list of strings")
        options: dict[str, Any] = {}
        for key, kind in [("unk_token", str), ("eos_token", str), ("lower_case", bool), ("language", str)]:
            if key in spec:
                if not isinstance(spec[key], kind):
                    raise TokenizerError(f"word tokenizer{where}: {key!r} must be a {kind.__name__}")
                options[key] = spec[key]
        extra = spec.get("additional_special_tokens", [FORMULA])
        if not isinstance(extra, list) or not all(isinstance(s, str) for s in extra):
            raise TokenizerError(
                f"word tokenizer{where}: 'additional_special_tokens' must be a list of strings"
            )
        added = spec.get("added_tokens", [])
        if not isinstance(added, list):
            raise TokenizerError(f"word tokenizer{where}: 'added_tokens' must be a list")
        tokens = [AddedToken.from_json(entry, where) for entry in added]
        return cls(vocab, additional_special_tokens=extra, added_tokens=tokens, **options)

    # ---- encoding ----

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        lines = text.split("\n")
        for i, line in enumerate(lines):
            ids.extend(map(self.id_of, self.tokenize_line(line)))
            if i < len(lines) - 1 and self.eos_id is not None:
                ids.append(self.eos_id)
        return ids

    def id_of(self, sym: str) -> int:
        """HF's `convert_tokens_to_ids`: the added-token table first, then the vocabulary."""
        added = self._added_ids.get(sym)
        return added if added is not None else self._ids.get(sym, self.unk_id)

    def tokenize_line(self, line: str) -> list[str]:
        """HF's `tokenize(line)`: symbols, before the lookup in the vocabulary."""
        if self.lower_case:
            # HF lower-cases character by character around the tokens it keeps, then cuts the text again.
            parts = self._case_split.split(line)
            line = "".join(p if i % 2 else "".join(c.lower() for c in p) for i, p in enumerate(parts))
        pieces = [p for p in self._special_split.split(line) if p]  # as HF's trie cuts: no empty pieces
        if self.added_tokens:
            self._strip_around_added(pieces)
        symbols: list[str] = []
        for piece in pieces:
            if piece in self._uncut:
                symbols.append(piece)
            elif piece:  # a piece that an added token's stripping emptied is dropped, as HF drops it
                symbols.extend(self._moses_pipeline(piece))
        return symbols

    def _strip_around_added(self, pieces: list[str]) -> None:
        """HF's `lstrip`, `rstrip` and `single_word`, applied in place left to right as HF applies them."""
        for i, piece in enumerate(pieces):
            token = self._added.get(piece)
            if token is None:
                continue
            left = pieces[i - 1] if i > 0 else None
            right = pieces[i + 1] if i + 1 < len(pieces) else None
            if token.rstrip and right:
                pieces[i + 1] = right.lstrip()
            if token.lstrip and left:
                pieces[i - 1] = left.rstrip()
            if token.single_word and left and left[-1] != " ":
                pieces[i - 1] += piece
                pieces[i] = ""
            elif token.single_word and right and right[0] != " ":
                pieces[i + 1] = piece + pieces[i + 1]
                pieces[i] = ""

    def _moses_pipeline(self, text: str) -> list[str]:
        text = text.strip()
        if self.lower_case:
            text = text.lower()
        if not text:
            return []
        text = self._normalizer.normalize(text)
        words = self._moses.tokenize(
            text,
            aggressive_dash_splits=True,
            return_str=False,
            escape=False,
            protected_patterns=self._protected,
        )
        return [sym for word in words for sym in _NUMBER_SEPARATOR.sub(r" @\g<0>@ ", word).split()]

    # ---- decoding ----

    def symbol(self, token_id: int) -> str:
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is outside the vocabulary (size {self.vocab_size})")
        return self.vocab[token_id]

    def token_text(self, token_id: int) -> str:
        return self.symbol(token_id)

    def decode(self, ids: Sequence[int]) -> str:
        decoder = self.decoder()
        return "".join(decoder.push(i) for i in ids) + decoder.flush()

    def decoder(self, previous: Sequence[int] = ()) -> WordDecoder:
        return WordDecoder(self, previous)


class _Layout:
    """Writes symbols one by one, choosing the separator before each from a bounded state.

    Each rule keeps a join only where Moses splits the joined text back into the same symbols, so that decoded
    text re-encodes to the same ids.
    """

    def __init__(self, tokenizer: WordTokenizer) -> None:
        self._tok = tokenizer
        self.prev: str | None = None  # None at the start of a line
        self.quote_open = False  # an odd number of `"` so far in this line
        self.word = ""  # the end of the current Moses word (no space, no Moses-padded character since)

    def waits_for_next(self, sym: str) -> bool:
        """Whether the separator before `sym` depends on the symbol after it."""
        return self.prev is not None and sym in (".", "'")

    def write(self, sym: str, following: str | None) -> str:
        """The text of `sym`. `following` is the next symbol (None at the end), read only if `waits_for_next`."""
        tok = self._tok
        if sym == tok.eos_token:
            self.prev, self.quote_open, self.word = None, False, ""
            return "\n"
        # A special token ends a Moses input, like the end of the line (HF cuts the text around specials).
        if following in tok.special_tokens:
            following = None
        space = self.prev is not None and self._space_before(self.prev, sym, following)
        surface = _SURFACE.get(sym, sym)
        self.word = "" if sym in tok.special_tokens else _word_end(("" if space else self.word) + surface)
        self.quote_open ^= sym == '"'
        self.prev = sym
        return " " + surface if space else surface

    def _space_before(self, prev: str, sym: str, following: str | None) -> bool:
        if sym in _JOINED or prev in _JOINED:
            return False
        if sym[0] in ",." and prev[-1] in _DOUBLE_QUOTES:
            return True  # the normaliser would move `,` or `.` inside the quotes: `"a",` -> `"a,"`
        if prev in _ATTACH_RIGHT:
            return False
        if sym == '"':
            return not self.quote_open  # an opening quote is spaced, a closing one attaches
        if prev == '"' and self.quote_open:
            return False  # just after an opening quote
        if sym in _ATTACH_LEFT:
            return False
        if _DOTS.fullmatch(sym):
            # `..` runs would merge into one longer run of dots; `Mr.` would stay one word.
            return prev.endswith(".") or (sym == "." and not self._period_splits(following))
        if sym == "'":
            # `players' club` splits, but a final `players'` stays one word (Moses needs a character after it).
            return not (prev[-1] in _ALPHA and following is not None)
        if len(sym) > 1 and sym[0] == "'" and sym[1] in _ALPHA:
            # Moses splits `don't` as `don 't` and `1990's` as `1990 's`; elsewhere `'s` cannot come back.
            return not (prev[-1] in _ALPHA or (prev[-1] in _DIGITS and sym.startswith("'s")))
        return not (prev in _CURRENCY and sym[0].isdigit())

    def _period_splits(self, following: str | None) -> bool:
        """Whether Moses splits `word.` into `word` and `.` (its `handles_nonbreaking_prefixes`)."""
        word, tok = self.word, self._tok
        if not word:
            return True
        if "." in word and any(c in _ALPHA for c in word):
            return False  # `U.S.`, `e.g.`
        if word in tok._abbreviations and word not in tok._numeric_abbreviations:
            return False  # `Mr.`, `vs.`, `A.`
        after = _SURFACE.get(following, following) if following is not None else ""
        if after and after[0] in _LOWER:
            return False  # Moses takes a period followed by a lower-case word for an abbreviation's
        return not (word in tok._numeric_abbreviations and after[:1] in _ASCII_DIGITS)  # `No. 5`


def _word_end(text: str, limit: int = 64) -> str:
    """The trailing run of characters that Moses keeps in one word (bounded: only abbreviations matter)."""
    end = len(text)
    start = end
    while start > 0 and end - start < limit and text[start - 1] in _WORD_CHARS:
        start -= 1
    return text[start:end]


class WordDecoder:
    """Streams `decode`: holds back only a `.` or `'`, whose spacing depends on the next symbol."""

    def __init__(self, tokenizer: WordTokenizer, previous: Sequence[int] = ()) -> None:
        self._tok = tokenizer
        self._layout = _Layout(tokenizer)
        self._held: str | None = None
        ids = list(previous)
        eos, quote = tokenizer.eos_id, tokenizer._ids.get('"')
        line_start = len(ids) - ids[::-1].index(eos) if eos in ids else 0
        # The quote parity needs the whole line (counted, cheap); the rest of the state only the last symbols.
        replay = max(line_start, len(ids) - _CONTEXT_TOKENS)
        self._layout.quote_open = quote is not None and ids[line_start:replay].count(quote) % 2 == 1
        context = [tokenizer.symbol(i) for i in ids[replay:]]
        for i, sym in enumerate(context):
            self._layout.write(sym, context[i + 1] if i + 1 < len(context) else None)

    def push(self, token_id: int) -> str:
        sym = self._tok.symbol(token_id)
        text = ""
        if self._held is not None:
            text = self._layout.write(self._held, sym)
            self._held = None
        if self._layout.waits_for_next(sym):
            self._held = sym
            return text
        return text + self._layout.write(sym, None)

    @property
    def has_pending(self) -> bool:
        """Whether a `.` or `'` is held back (flush would return it)."""
        return self._held is not None

    def flush(self) -> str:
        held, self._held = self._held, None
        return "" if held is None else self._layout.write(held, None)


def convert_hf_vocab(src_path: str | Path, dst: str | Path) -> Path:
    """Converts HF's `vocab.pkl` (or the legacy `vocab.bin`) to our `tokenizer.json`, never running pickled code,
    with the added-token table of the directory it is in (`tokenizer_config.json`, see hf_directory.py).

    `dst` is a model directory (the file is written there as `tokenizer.json`) or a file path. Returns the path.
    """
    tokenizer = WordTokenizer.from_json(read_hf_tokenizer(Path(src_path)))
    path = Path(dst)
    if path.is_dir():
        path = path / TOKENIZER_NAME
    path.write_text(json.dumps(tokenizer.to_json(), ensure_ascii=False) + "\n", encoding="utf-8")
    return path
