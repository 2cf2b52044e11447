"""Undoing the tokenization of the NLTK Gutenberg books and of WikiText-103, so a model learns text as people write it.

Both corpora come split into tokens by spaces: punctuation stands apart (`word , word .`), contractions are cut
(`do n't`, `Emma 's`), and each has its own quirks: the NLTK books write double quotes as `` and '', single quotes as
` and ', italics as `_ word _`, and put one sentence on each line; WikiText-103 writes `@-@`, `@,@` and `@.@` for a
hyphen, thousands separator and decimal point inside a number, plain `"` for both quotes, one paragraph a line and
headings as `= = Title = =`. `join_tokens` turns one such line back into ordinary spacing; the corpus functions below
rebuild paragraphs.
"""

from __future__ import annotations

import re

# Tokens that belong to the word before them (no space before).
_ATTACH_LEFT = {",", ".", ";", ":", "?", "!", ")", "]", "}", "...", "%", "''", ";)", ":)", "n't", "N'T"}
_CLITICS = {"'s", "'d", "'ll", "'ve", "'re", "'m"}  # compared lower-cased: 'S, 'LL...
# Tokens that belong to the word after them (no space after).
_ATTACH_RIGHT = {"(", "[", "{", "``", "`", "$", "£", "#", "“", "‘"}
# Tokens glued on both sides: a Gutenberg dash is `word--word`, and WikiText's @-@ family sits inside a word or number.
_ATTACH_BOTH = {"--": "--", "@-@": "-", "@,@": ",", "@.@": ".", "@/@": "/"}
_RENDER = {"``": '"', "''": '"', "`": "'"}


def _attaches_left(token: str) -> bool:
    low = token.lower()
    return (
        token in _ATTACH_LEFT or low in _CLITICS or low == "n't" or bool(re.fullmatch(r"\.{2,}|[”’]", token))
    )


def join_tokens(line: str) -> str:
    """One space-tokenized line -> ordinary spacing (`He said , `` I do n't . ''` -> `He said, "I don't."`).

    A bare `"` (WikiText) or `_` (italics in the NLTK books) opens and closes in turn within the line; a bare `'`
    closes a single quote or marks a plural possessive (`days ' absence`), both glued to the word before.
    """
    # Some books split a contraction after its apostrophe (`I' ll`, the same word as `I 'll`), or glue an opening
    # quote, written as a closing one, to a word (`''I`).
    line = re.sub(r"(?<=\w)' (ll|m|ve|d|re|s)\b", r" '\1", line)
    line = re.sub(r"(^| )''(?=\w)", r"\1`` ", line)
    out: list[str] = []
    glue_next = True  # no space before the first token
    open_double = open_underscore = False
    for token in line.split():
        text = _RENDER.get(token, token)
        left = _attaches_left(token)
        right = token in _ATTACH_RIGHT
        if token in _ATTACH_BOTH:
            text, left, right = _ATTACH_BOTH[token], True, True
        elif token == '"':  # noqa: S105 - a quote mark, not a password
            left, right = open_double, not open_double
            open_double = not open_double
        elif token == "_":  # noqa: S105
            left, right = open_underscore, not open_underscore
            open_underscore = not open_underscore
        elif token == "'":  # noqa: S105
            left = True
        if out and not glue_next and not left:
            out.append(" ")
        out.append(text)
        glue_next = right
    return _fix_words("".join(out))


def _fix_words(text: str) -> str:
    # The Treebank tokenizer splits these words in two; the books write them whole.
    text = re.sub(r"\b([Cc])an not\b", r"\1annot", text)
    text = re.sub(r"\b([Gg])on na\b", r"\1onna", text)
    text = re.sub(r"\b([Ww])an na\b", r"\1anna", text)
    # A range of numbers keeps its en dash tight: WikiText's `5 – 6 kg` is `5–6 kg` as Wikipedia writes it.
    return re.sub(r"(?<=\d) – (?=\d)", "–", text)


# ---------------------------------------------------------------------------------------------- NLTK Gutenberg

_CHAPTER = re.compile(r"^((?:CHAPTER|Chapter|BOOK|Book|PART|Part|VOLUME|STAVE)\s+[IVXLC\d]+\.?)\s+(\S.*)$")
# Narration has lost its paragraph breaks: cut after this many characters, at a sentence end.
_PARAGRAPH_CHARS = 700


def _is_heading(line: str) -> bool:
    """A title in brackets, or a short line in capitals (`CHAPTER I`, `VOLUME II`, `ETYMOLOGY .`)."""
    if line.startswith("[ ") and line.endswith(" ]"):
        return True
    letters = [c for c in line if c.isalpha()]
    return bool(letters) and len(line) <= 60 and all(c.isupper() for c in letters)


def _quote_balance(line: str) -> int:
    tokens = line.split()
    return tokens.count("``") - tokens.count("''")


def gutenberg_text(tokenized: str) -> str:
    """A book of the NLTK Gutenberg selection (one tokenized sentence a line) -> paragraphs of ordinary text.

    The paragraph breaks themselves are lost upstream; they are rebuilt where the text shows them: around headings,
    where a speaker's quotation opens or has closed (each turn of a dialogue is its own paragraph), and otherwise
    after about `_PARAGRAPH_CHARS` characters of narration, at the end of a sentence.
    """
    paragraphs: list[str] = []
    current: list[str] = []
    length = 0
    in_quote = False  # a quotation that spans several sentences is one paragraph

    def flush() -> None:
        nonlocal length
        if current:
            # A sentence that starts with punctuation continues the one before it (`...way?' , holding her hand`).
            paragraphs.append(re.sub(r" (?=[,;:.!?)])", "", " ".join(current)))
            current.clear()
        length = 0

    for raw in tokenized.splitlines():
        line = raw.strip()
        if line.startswith("' ") and current:
            # The sentence splitter left the previous sentence's closing quote at the start of this line; a second
            # quote mark after it opens this line's speech.
            current[-1] += "'"
            line = line[2:]
            if line.startswith("' "):
                line = "` " + line[2:]
        if not line:
            continue
        chapter = _CHAPTER.match(line)
        if chapter:  # the sentence splitter glued `CHAPTER II` to the chapter's first sentence
            flush()
            paragraphs.append(join_tokens(chapter.group(1)))
            line = chapter.group(2)
        elif _is_heading(line):
            flush()
            paragraphs.append(join_tokens(line.strip("[] ")) if line.startswith("[") else join_tokens(line))
            continue
        opens_speech = line.startswith("`") and not in_quote
        if opens_speech or (not in_quote and length >= _PARAGRAPH_CHARS):
            flush()
        sentence = join_tokens(line)
        current.append(sentence)
        length += len(sentence)
        in_quote = (_quote_balance(line) > 0) if not in_quote else (_quote_balance(line) >= 0)
        if not in_quote and line.endswith("''"):  # a speech ended: the next sentence starts a new turn
            flush()
    flush()
    return "\n\n".join(paragraphs) + "\n"


# ---------------------------------------------------------------------------------------------- WikiText-103

_HEADING = re.compile(r"^(=(?: =)*) (.+?) \1$")
_SENTENCE_END = re.compile(r"(?<= [.?!]) (?=[A-Z\"(])")


def wikitext_articles(tokenized: str, *, drop_unknown: bool = True) -> list[str]:
    """WikiText-103 (one paragraph a line, `= Title =` and `= = Section = =` headings) -> articles of ordinary text.

    Each article starts with its title; a section heading is a line of its own. WikiText replaced rare words by
    `<unk>`, which is not text anyone writes: with `drop_unknown` the sentences (and headings) holding one are left
    out (whole paragraphs would lose a third of the text). A section left empty by that loses its heading too.
    """
    articles: list[list[str]] = []
    pending_heading: str | None = None
    for raw in tokenized.splitlines():
        line = raw.strip()
        if not line:
            continue
        heading = _HEADING.match(line)
        if heading and heading.group(1) == "=":
            # A title naming an unknown word still starts an article, one without its title.
            unknown = drop_unknown and "<unk>" in line
            articles.append(["" if unknown else join_tokens(heading.group(2))])
            pending_heading = None
            continue
        if not articles:
            continue
        if heading:
            unknown = drop_unknown and "<unk>" in line
            pending_heading = None if unknown else join_tokens(heading.group(2))
            continue
        sentences = _SENTENCE_END.split(line)
        if drop_unknown:
            sentences = [s for s in sentences if "<unk>" not in s]
        if not sentences:
            continue
        if pending_heading is not None:
            articles[-1].append(pending_heading)
            pending_heading = None
        articles[-1].append(join_tokens(" ".join(sentences)))
    return ["\n\n".join(p for p in parts if p) + "\n" for parts in articles if len(parts) > 1]
