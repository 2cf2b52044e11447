"""Reading HF's pickled Transformer-XL vocabulary (`vocab.pkl`, or the legacy `vocab.bin`) without running its code.

This is the only place in the code base that unpickles a file, and it does so once, to convert the vocabulary to
JSON (`txl.tokenizers.word.convert_hf_vocab`). A pickle can name any importable callable and call it while loading
(`os.system`, `builtins.eval`), so the unpickler below resolves only an allowlist: plain containers, `OrderedDict`
and `Counter`. HF's `save_vocabulary` pickles the tokenizer's whole `__dict__`, which also holds sacremoses
objects, compiled regexes, a `Trie` and `AddedToken`s; those few known names become an inert placeholder (their
modules are never imported, their code never runs), which for an `AddedToken` keeps the plain values of its
state (HF's added-token table, see `added.py`). Every other name is refused before anything is built.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

from .added import AddedToken

# `torch.save` without the zip format writes this number, then the protocol version and system info, each as
# its own pickle, before the object itself.
_TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


class VocabFileError(ValueError):
    """A vocabulary file cannot be read or does not describe a word vocabulary."""


class UnsafePickleError(VocabFileError):
    """A pickle names something a vocabulary never contains; nothing of it was executed."""


class _Inert:
    """Stands in for tokenizer machinery the vocabulary does not need: accepts any arguments, runs nothing."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Inert:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass


class _PickledAddedToken(_Inert):
    """An HF `AddedToken` (tokenizers' or transformers' own): keeps the state it is given, code never runs."""

    state: dict[str, Any]

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple):  # (dict state, slot state), as pickle hands over objects with __slots__
            state = next((part for part in state if isinstance(part, dict)), None)
        self.state = state if isinstance(state, dict) else {}


_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("collections", "Counter"): Counter,
    # Protocols 0-2 spell these as calls; Python 2 era files name the module `__builtin__`.
    **{
        (module, t.__name__): t for module in ("builtins", "__builtin__") for t in (set, frozenset, bytearray)
    },
}
_INERT = {
    ("re", "_compile"),
    ("sacremoses.normalize", "MosesPunctNormalizer"),
    ("sacremoses.tokenize", "MosesTokenizer"),
    ("sacremoses.tokenize", "MosesDetokenizer"),
    ("transformers.tokenization_utils", "Trie"),
}
_ADDED_TOKEN = {("tokenizers", "AddedToken"), ("transformers.tokenization_utils_base", "AddedToken")}


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the allowlisted names (see the module docstring) and no tensors."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return _ALLOWED[module, name]
        if (module, name) in _INERT:
            return _Inert
        if (module, name) in _ADDED_TOKEN:
            return _PickledAddedToken
        raise UnsafePickleError(
            f"refusing to unpickle {module}.{name}: a vocabulary file has no reason to reference it "
            "(nothing was executed; the file may be malicious)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise VocabFileError("the file holds tensors; a vocabulary has none")


def _unpickle(stream: io.BytesIO) -> Any:
    try:
        return RestrictedUnpickler(stream).load()
    except VocabFileError:
        raise
    except Exception as exc:  # truncated or not a pickle: all mean "cannot use this file"
        raise VocabFileError(f"not a readable pickle: {exc}") from exc


def load_hf_vocab(path: Path) -> dict:
    """The pickled state of an HF `TransfoXLTokenizer`: a plain pickle, or `torch.save`'s zip or legacy format."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise VocabFileError(f"cannot read {path}: {exc}") from exc
    try:
        if zipfile.is_zipfile(io.BytesIO(data)):
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                pickles = [n for n in archive.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
                if len(pickles) != 1:
                    raise VocabFileError("a zip file that is not a torch.save archive")
                state = _unpickle(io.BytesIO(archive.read(pickles[0])))
        else:
            stream = io.BytesIO(data)
            state = _unpickle(stream)
            if type(state) is int and state == _TORCH_LEGACY_MAGIC:
                for _ in range(2):  # protocol version, system info
                    _unpickle(stream)
                state = _unpickle(stream)
    except UnsafePickleError as exc:
        raise UnsafePickleError(f"{path}: {exc}") from None
    except (VocabFileError, zipfile.BadZipFile) as exc:
        raise VocabFileError(f"{path}: {exc}") from exc
    if not isinstance(state, dict):
        raise VocabFileError(f"{path}: holds a {type(state).__name__}, not a tokenizer's state")
    return state


def spec_from_hf_vocab(state: dict) -> dict:
    """Our tokenizer description (see `WordTokenizer.to_json`) from the pickled state."""
    sym2idx, idx2sym = state.get("sym2idx"), state.get("idx2sym")
    if isinstance(sym2idx, dict) and sym2idx:
        # HF encodes with sym2idx (and does not even restore idx2sym from the file), so it decides the ids.
        if not all(isinstance(s, str) and type(i) is int for s, i in sym2idx.items()):
            raise VocabFileError("sym2idx must map strings to integers")
        if sorted(sym2idx.values()) != list(range(len(sym2idx))):
            raise VocabFileError("sym2idx ids are not 0..n-1")
        vocab = sorted(sym2idx, key=sym2idx.__getitem__)
        if isinstance(idx2sym, list) and idx2sym and idx2sym != vocab:
            raise VocabFileError("idx2sym and sym2idx disagree")
    elif isinstance(idx2sym, list) and idx2sym and all(isinstance(s, str) for s in idx2sym):
        vocab = list(idx2sym)
    else:
        raise VocabFileError("no vocabulary (idx2sym / sym2idx) in the file")
    unk_idx = state.get("unk_idx")
    if type(unk_idx) is int and 0 <= unk_idx < len(vocab):
        unk = vocab[unk_idx]
    else:  # HF's fallbacks, in its order
        unk = next((s for s in ("<unk>", "<UNK>") if s in vocab), None)
    if unk is None:
        raise VocabFileError("the vocabulary has no unknown-word token (<unk> or unk_idx)")
    if state.get("delimiter") == "":
        raise VocabFileError("character-level vocabularies (delimiter '') are not supported")
    language = state.get("language", "en")
    return {
        "type": "word",
        "vocab": vocab,
        "unk_token": unk,
        "eos_token": "<eos>",
        "additional_special_tokens": ["<formula>"],
        "lower_case": bool(state.get("lower_case", False)),
        "language": language if isinstance(language, str) else "en",
    }


def pickled_added_tokens(state: dict) -> dict[int, AddedToken]:
    """The added-token table HF pickled with the vocabulary (`_added_tokens_decoder`, transformers >= 4.34): HF
    keeps it when it loads the file, beneath the one in `tokenizer_config.json`."""
    decoder = state.get("_added_tokens_decoder")
    if not isinstance(decoder, dict):
        return {}
    table = {}
    for token_id, token in decoder.items():
        if not isinstance(token, _PickledAddedToken):
            raise VocabFileError(f"_added_tokens_decoder[{token_id!r}] is not an AddedToken")
        table[token_id] = AddedToken.from_json({**token.state, "id": token_id}, " in _added_tokens_decoder")
    return table


def read_hf_vocab(path: Path) -> dict:
    """Our tokenizer description from HF's vocabulary file; errors name the file."""
    state = load_hf_vocab(path)
    try:
        return spec_from_hf_vocab(state)
    except VocabFileError as exc:
        raise VocabFileError(f"{path}: {exc}") from None
