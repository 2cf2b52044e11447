"""Converting HF's pickled vocabularies to JSON: the same encodings as HF, and malicious pickles never run."""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from collections import Counter, OrderedDict
from pathlib import Path

import pytest
from txl.tokenizers import load_tokenizer
from txl.tokenizers.vocab_pickle import UnsafePickleError, VocabFileError
from txl.tokenizers.word import WordTokenizer, convert_hf_vocab

from tests.model.hf_oracle import hf_tokenizer

ROOT = Path(__file__).resolve().parents[2]

CORPUS = """
 = Homarus gammarus =
 Homarus gammarus , known as the European lobster , is a species of clawed lobster from the eastern Atlantic .
 It may grow to a length of 60 cm ( 24 in ) and a mass of 6 kilograms ( 13 lb ) , and it 's blue .
 In life , the lobsters are blue , only becoming " lobster red " on cooking . They don 't live long .
 The 23 @,@ 000 well @-@ known players ' club did not open in 1 @.@ 5 years ; Mr. <unk> said so .
 The lobster is <unk> , and the <unk> is a lobster of the Atlantic . The club is the lobster 's .
""".strip().split("\n")

PROBES = [
    *CORPUS,
    "The 23,000 well-known players' club didn't open in 1.5 years.",
    'He said "no" -- twice <unk> and <eos> here; Mr. Smith\'s e-mail costs $5.',
    "Lobsters (Homarus) are BLUE, not red: 1,000.5 of them!",
]


@pytest.fixture(scope="module")
def hf_saved(tmp_path_factory):
    """A vocabulary saved by HF's own `save_vocabulary` (the tokenizer's whole `__dict__`, pickled), with the
    HF tokenizer it came from."""
    folder = tmp_path_factory.mktemp("hf_saved")
    vocab_file = folder / "vocab.txt"
    vocab_file.write_text("\n".join(WordTokenizer.build_vocab(CORPUS).vocab) + "\n", encoding="utf-8")
    # Given its vocabulary at construction: one built later (count_sents, build_vocab) keeps the ids its special
    # tokens got while the vocabulary was empty, and maps a literal `<unk>` in text to another word (an HF bug).
    hf = hf_tokenizer(vocab_file=str(vocab_file))
    hf.count_sents([line.split() for line in CORPUS])  # so that the pickle holds a Counter too
    (path,) = hf.save_vocabulary(str(folder))
    return Path(path), hf


@pytest.mark.oracle
def test_converted_hf_vocab_pkl_encodes_as_hf(tmp_path, hf_saved):
    path, hf = hf_saved
    assert convert_hf_vocab(path, tmp_path) == tmp_path / "tokenizer.json"
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, WordTokenizer) and tok.vocab == hf.idx2sym
    reloaded = hf_tokenizer(pretrained_vocab_file=str(path))  # HF reading its own pickle
    for line in PROBES:
        assert tok.encode(line) == hf.encode(line) == reloaded.encode(line), line
    assert tok.unk_id in tok.encode(PROBES[-1])  # the probes reach the unknown-word fallback too


@pytest.mark.oracle
@pytest.mark.parametrize("zipped", [True, False])
def test_converted_torch_saved_vocab_bin_is_the_same(tmp_path, hf_saved, zipped):
    """The legacy `vocab.bin`: `torch.save` of the same state (here HF's whole `__dict__`, as `save_vocabulary`
    pickles it), in torch's zip format or its older one."""
    torch = pytest.importorskip("torch")
    _, hf = hf_saved
    bin_path = tmp_path / "vocab.bin"
    torch.save(hf.__dict__, bin_path, _use_new_zipfile_serialization=zipped)
    assert zipfile.is_zipfile(bin_path) == zipped
    convert_hf_vocab(bin_path, tmp_path / "tokenizer.json")
    assert load_tokenizer(tmp_path).to_json() == WordTokenizer(hf.idx2sym).to_json()


def test_plain_vocabulary_fields_convert_without_hf(tmp_path):
    """What the original Transformer-XL code pickled: the `Vocab` fields only."""
    symbols = ["<eos>", "the", "<unk>", "lobster"]
    state = {
        "special": ["<eos>"],
        "counter": Counter({"the": 3, "<unk>": 2, "lobster": 1}),
        "idx2sym": symbols,
        "sym2idx": OrderedDict((s, i) for i, s in enumerate(symbols)),
        "unk_idx": 2,
        "lower_case": True,
        "delimiter": None,
    }
    (tmp_path / "vocab.pkl").write_bytes(pickle.dumps(state, protocol=2))
    convert_hf_vocab(tmp_path / "vocab.pkl", tmp_path)
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, WordTokenizer)
    assert (tok.vocab, tok.unk_token, tok.lower_case) == (symbols, "<unk>", True)
    assert tok.encode("The Lobster crab\n") == [1, 3, 2, 0]


class Evil:
    """Unpickling this runs a shell command (in an unguarded unpickler)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def evil_file(tmp_path: Path, marker: Path, kind: str) -> Path:
    payload = pickle.dumps({"idx2sym": ["<unk>", "a"], "hook": Evil(marker)}, protocol=2)
    path = tmp_path / f"evil_{kind}.bin"
    if kind == "pickle":
        path.write_bytes(payload)
    elif kind == "eval":
        path.write_bytes(b"cbuiltins\neval\n(Vprint('pwned')\ntR.")
    elif kind == "legacy":  # torch.save's older format: the payload after the magic number
        header = [0x1950A86A20F9469CFC6C, 1001, {}]
        path.write_bytes(b"".join(pickle.dumps(x, protocol=2) for x in header) + payload)
    else:  # torch.save's zip format
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("evil_zip/data.pkl", payload)
            archive.writestr("evil_zip/version", "3\n")
    return path


@pytest.mark.parametrize("kind", ["pickle", "eval", "legacy", "zip"])
def test_malicious_pickles_are_refused_and_never_run(tmp_path, kind):
    marker = tmp_path / "pwned"
    path = evil_file(tmp_path, marker, kind)
    with pytest.raises(UnsafePickleError, match=r"refusing to unpickle (posix\.system|builtins\.eval)"):
        convert_hf_vocab(path, tmp_path)
    assert not marker.exists()
    assert not (tmp_path / "tokenizer.json").exists()


def test_broken_vocab_files_are_named(tmp_path):
    cases = {
        "truncated.pkl": pickle.dumps({"idx2sym": ["<unk>"]})[:-5],
        "list.pkl": pickle.dumps(["<unk>", "a"]),
        "novocab.pkl": pickle.dumps({"special": []}),
        "nounk.pkl": pickle.dumps({"idx2sym": ["a", "b"]}),
        "chars.pkl": pickle.dumps({"idx2sym": ["<unk>", "a"], "delimiter": ""}),
        "gaps.pkl": pickle.dumps({"sym2idx": {"<unk>": 0, "a": 2}}),
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(VocabFileError, match=name):
            convert_hf_vocab(tmp_path / name, tmp_path / "out.json")
    with pytest.raises(VocabFileError, match="cannot read"):
        convert_hf_vocab(tmp_path / "missing.pkl", tmp_path / "out.json")
    torch = pytest.importorskip("torch")
    torch.save({"idx2sym": ["<unk>", "a"], "weights": torch.zeros(2)}, tmp_path / "tensor.bin")
    with pytest.raises(UnsafePickleError, match=r"refusing to unpickle torch\._utils"):
        convert_hf_vocab(tmp_path / "tensor.bin", tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()


def test_nothing_else_unpickles():
    """The restricted unpickler is the only unpickling code in the library and the server."""
    allowed = ROOT / "model" / "txl" / "tokenizers" / "vocab_pickle.py"
    pattern = re.compile(r"\bpickle\.(load|loads|Unpickler)\b|\b(dill|joblib|cloudpickle)\b|\bshelve\.open")
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("model", "server")
        for path in (ROOT / folder).rglob("*.py")
        if path != allowed and pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


@pytest.mark.oracle
def test_a_directory_with_only_hf_vocab_pkl_loads_safely(tmp_path, hf_saved):
    path, hf = hf_saved
    (tmp_path / "vocab.pkl").write_bytes(path.read_bytes())
    tok = load_tokenizer(tmp_path)  # no tokenizer.json: the restricted unpickler reads HF's file
    assert isinstance(tok, WordTokenizer)
    for line in PROBES:
        assert tok.encode(line) == hf.encode(line)
