"""The detokenizer turns the NLTK Gutenberg and WikiText-103 tokenizations back into text as people write it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from txl.training.data.detokenize import gutenberg_text, join_tokens, wikitext_articles

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize(
    ("tokenized", "expected"),
    [
        ("`` I do n't know , '' said he .", '"I don\'t know," said he.'),
        ("Emma 's father ; her sister 's marriage : done !", "Emma's father; her sister's marriage: done!"),
        ("after some days ' absence", "after some days' absence"),
        ("by ` success , ' '' said Mr. Knightley .", "by 'success,'\" said Mr. Knightley."),
        ("I' ll try ; I' m sure", "I'll try; I'm sure"),
        ("Between _ them _ it was", "Between _them_ it was"),
        ("Sorrow came -- a gentle sorrow -- but", "Sorrow came--a gentle sorrow--but"),
        ("( for we are one , ) That", "(for we are one,) That"),
        ("I can not say ; they 'll go", "I cannot say; they'll go"),
        ("weigh 0 @.@ 7 – 2 @.@ 2 kg ( 1 @,@ 500 lb )", "weigh 0.7–2.2 kg (1,500 lb)"),
        ('a red @-@ tipped " crusher " , and', 'a red-tipped "crusher", and'),
        ("cost $ 5 , or 10 % more", "cost $5, or 10% more"),
        ("I 'M SURE it WAS N'T", "I'M SURE it WASN'T"),
    ],
)
def test_join_tokens(tokenized, expected):
    assert join_tokens(tokenized) == expected


def test_gutenberg_rebuilds_headings_and_dialogue_paragraphs():
    tokenized = "\n".join(
        [
            "[ Emma by Jane Austen 1816 ]",
            "VOLUME I",
            "CHAPTER I",
            "Emma Woodhouse , handsome , clever , and rich , was twenty-one .",
            "She was the youngest .",
            "`` Poor Miss Taylor !",
            "I wish she were here . ''",
            "`` My dear , '' said he , `` you know I do . ''",
            "CHAPTER II Mr. Weston was a native of Highbury .",
        ]
    )
    assert gutenberg_text(tokenized).split("\n\n") == [
        "Emma by Jane Austen 1816",
        "VOLUME I",
        "CHAPTER I",
        "Emma Woodhouse, handsome, clever, and rich, was twenty-one. She was the youngest.",
        '"Poor Miss Taylor! I wish she were here."',
        '"My dear," said he, "you know I do."',
        "CHAPTER II",
        "Mr. Weston was a native of Highbury.\n",
    ]


def test_gutenberg_book_has_no_tokenizer_spacing():
    text = gutenberg_text((DATA / "gutenberg" / "carroll-alice.txt").read_text(encoding="utf-8"))
    for marker in (" ,", " .", " ;", "``", "''", " n't", " 's "):
        assert marker not in text, marker
    paragraphs = text.split("\n\n")
    assert len(paragraphs) > 50
    assert max(len(p) for p in paragraphs) < 3000  # narration is cut into paragraphs


def test_wikitext_articles_have_titles_sections_and_no_unknown_words():
    tokenized = "\n".join(
        [
            " = Homarus gammarus = ",
            " ",
            " Homarus gammarus is a species . It is blue . The <unk> is red . ",
            " ",
            " = = Description = = ",
            " ",
            " It weighs 5 @,@ 000 g ( 11 lb ) . ",
            " = = Empty = = ",
            " Only <unk> here . ",
            " = Next = ",
            " Text . ",
        ]
    )
    articles = wikitext_articles(tokenized)
    assert articles[0] == (
        "Homarus gammarus\n\nHomarus gammarus is a species. It is blue.\n\nDescription\n\nIt weighs 5,000 g (11 lb).\n"
    )
    assert articles[1] == "Next\n\nText.\n"
    assert "<unk>" in wikitext_articles(tokenized, drop_unknown=False)[0]


def test_wikitext_valid_split_reads_as_prose():
    articles = wikitext_articles((DATA / "wikitext-103" / "wiki.valid.tokens").read_text(encoding="utf-8"))
    assert len(articles) == 60  # every article of the validation split
    text = "".join(articles)
    for marker in ("@-@", "@,@", "@.@", "<unk>", " = ="):
        assert marker not in text, marker
    assert not re.search(r" [,.;:!?](\s|$)", text)  # punctuation set apart (a calibre such as `.38` is not)
