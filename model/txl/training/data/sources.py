"""The training and held-out text of the bundled model: where each document comes from, its genre and its licence.

Every source is openly licensed text from the shared data folder or from a Debian package. Each yields documents
(name, text); `split_of` decides which are held out: whole books, whole WikiText splits and whole sections of the
Python documentation, so no held-out document shares a page with training text. Licence and copyright pages are
left out (boilerplate that every package repeats), and so are indexes, search pages and release notes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .detokenize import gutenberg_text, wikitext_articles
from .html_text import html_to_text

Document = tuple[str, str]  # (name, text)

# Held out, per genre: one document set for validation during training, one for the test figures of the card.
VALID_BOOKS = ("austen-persuasion.txt",)
TEST_BOOKS = ("chesterton-thursday.txt",)
# The NLTK copies of the plays glue speakers' names to their lines (`Long liue the King Fran .`): not recoverable.
# tiny-shakespeare has the plays as they are printed instead.
SKIPPED_BOOKS = ("shakespeare-caesar.txt", "shakespeare-hamlet.txt", "shakespeare-macbeth.txt")
PYTHON_VALID_DIRS = ("faq",)
PYTHON_TEST_DIRS = ("howto",)
# Pages of no prose: indexes, search, tables of contents, the changelog (a list of issue titles), licences.
_PYTHON_SKIPPED = re.compile(
    r"^(genindex.*|py-modindex|search|contents|index|copyright|license|about|bugs|download|whatsnew/changelog)\.html$"
)
_POSTGRES_SKIPPED = re.compile(r"^(legalnotice|bookindex|release.*|index|biblio|appendix-obsolete.*)\.html$")


@dataclass(frozen=True)
class Source:
    name: str
    genre: str  # fiction, technical, encyclopedic, dictionary
    licence: str
    origin: str  # where it comes from: a shared-data path or a Debian package
    documents: Callable[[Path, Path], Iterator[Document]]  # (data_dir, unpacked packages root) -> documents
    split_of: Callable[[str], str]  # document name -> "train", "valid", "test" or "skip"
    # Copies of each training document in the corpus (a fraction keeps that share of documents, drawn with a seed).
    # A run reads about half an epoch: encyclopedic text, the scarcest, is doubled and the bulk of the dictionary
    # and the database manual thinned so that the genres the card measures are well represented in what it reads.
    weight: float = 1.0


def _gutenberg(data_dir: Path, _: Path) -> Iterator[Document]:
    for path in sorted((data_dir / "gutenberg").glob("*.txt")):
        yield path.name, gutenberg_text(path.read_text(encoding="utf-8"))


def _book_split(name: str) -> str:
    if name in SKIPPED_BOOKS:
        return "skip"
    return "valid" if name in VALID_BOOKS else "test" if name in TEST_BOOKS else "train"


def _tinyshakespeare(data_dir: Path, _: Path) -> Iterator[Document]:
    yield "tinyshakespeare", (data_dir / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")


def _wikitext(data_dir: Path, _: Path) -> Iterator[Document]:
    for split, file in (
        ("train", "wiki.train.tokens.head"),
        ("valid", "wiki.valid.tokens"),
        ("test", "wiki.test.tokens"),
    ):
        text = (data_dir / "wikitext-103" / file).read_text(encoding="utf-8")
        articles = wikitext_articles(text)
        if split == "train":
            articles = articles[:-1]  # the head is cut mid-article
        for i, article in enumerate(articles):
            yield f"{split}/{i:05d}", article


def _html_pages(root: Path, skipped: re.Pattern[str]) -> Iterator[Document]:
    for path in sorted(root.rglob("*.html")):
        name = path.relative_to(root).as_posix()
        if name.startswith("_") or skipped.match(name):
            continue
        text = html_to_text(path.read_text(encoding="utf-8", errors="replace"))
        if len(text) >= 200:  # redirect stubs and empty section pages
            yield name, text


def _python_docs(_: Path, packages: Path) -> Iterator[Document]:
    yield from _html_pages(packages / "python3.11-doc/usr/share/doc/python3.11/html", _PYTHON_SKIPPED)


def _python_split(name: str) -> str:
    top = name.split("/")[0]
    return "valid" if top in PYTHON_VALID_DIRS else "test" if top in PYTHON_TEST_DIRS else "train"


def _postgres_docs(_: Path, packages: Path) -> Iterator[Document]:
    yield from _html_pages(
        packages / "postgresql-doc-15/usr/share/doc/postgresql-doc-15/html", _POSTGRES_SKIPPED
    )


_WORDNET_LINES = 200  # synsets per document, so that a weight below 1 samples the dictionary evenly


def _wordnet(_: Path, packages: Path) -> Iterator[Document]:
    """Each synset as `word, synonym (n.): gloss; "example"`, one a line, in documents of `_WORDNET_LINES`."""
    root = packages / "wordnet-base/usr/share/wordnet"
    for pos, tag in (("noun", "n."), ("verb", "v."), ("adj", "adj."), ("adv", "adv.")):
        lines = []
        for line in (root / f"data.{pos}").read_text(encoding="utf-8").splitlines():
            if line.startswith("  ") or " | " not in line:  # the licence header of each data file
                continue
            fields, gloss = line.split(" | ", 1)
            parts = fields.split()
            count = int(parts[3], 16)
            words = [re.sub(r"\(.*\)$", "", w).replace("_", " ") for w in parts[4 : 4 + 2 * count : 2]]
            lines.append(f"{', '.join(words)} ({tag}): {gloss.strip()}")
        for start in range(0, len(lines), _WORDNET_LINES):
            yield f"data.{pos}/{start}", "\n".join(lines[start : start + _WORDNET_LINES]) + "\n"


def _wikitext_split(name: str) -> str:
    return name.split("/")[0]


SOURCES = (
    Source(
        "gutenberg", "fiction", "public domain", "shared data gutenberg/ (NLTK Gutenberg selection)",
        _gutenberg, _book_split,
    ),
    Source("tinyshakespeare", "fiction", "public domain", "shared data tinyshakespeare/", _tinyshakespeare,
           lambda _: "train"),
    Source(
        "wikitext-103", "encyclopedic", "CC BY-SA 3.0 (Merity et al., 2016; Wikipedia authors)",
        "shared data wikitext-103/", _wikitext, _wikitext_split, weight=2.0,
    ),
    Source(
        "python-docs", "technical", "PSF License Agreement (Python 3.11 documentation)",
        "Debian package python3.11-doc", _python_docs, _python_split,
    ),
    Source(
        "postgresql-docs", "technical", "PostgreSQL Licence (BSD-style)", "Debian package postgresql-doc-15",
        _postgres_docs, lambda _: "train", weight=0.5,
    ),
    Source(
        "wordnet", "dictionary", "WordNet 3.0 licence (BSD-style, Princeton University)", "Debian package wordnet-base",
        _wordnet, lambda _: "train", weight=0.125,
    ),
)  # fmt: skip
PACKAGES = ("python3.11-doc", "postgresql-doc-15", "wordnet-base")
