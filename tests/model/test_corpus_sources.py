"""Documentation pages become plain text without navigation, and held-out documents never reach training."""

from __future__ import annotations

from txl.training.data.html_text import html_to_text
from txl.training.data.sources import SOURCES, _book_split, _python_split, _wordnet

SPHINX_PAGE = """<html><head><title>json</title><script>var x = 1;</script></head><body>
<div class="related" role="navigation"><ul><li><a href="index.html">index</a></li></ul></div>
<div class="body" role="main">
<h1>json — JSON encoder<a class="headerlink" href="#json">¶</a></h1>
<p>JSON is a <em>lightweight</em>
   data interchange format.</p>
<ul><li><p>First item</p></li><li>Second &amp; last</li></ul>
<div class="highlight"><pre><span>&gt;&gt;&gt; </span>import json
<span>&gt;&gt;&gt; </span>json.dumps([1,
    2])</pre></div>
<p>Unclosed paragraph<p>and another
</div>
<div class="footer">&copy; Copyright 2001-2023, Python Software Foundation.</div>
</body></html>"""


def test_html_page_keeps_text_blocks_and_code_and_drops_navigation():
    assert html_to_text(SPHINX_PAGE) == (
        "json — JSON encoder\n\n"
        "JSON is a lightweight data interchange format.\n\n"
        "First item\n\n"
        "Second & last\n\n"
        ">>> import json\n>>> json.dumps([1,\n    2])\n\n"
        "Unclosed paragraph\n\n"
        "and another\n"
    )


def test_page_without_text_is_empty():
    assert html_to_text("<html><body><div class='footer'>x</div></body></html>") == ""


def test_held_out_documents_are_not_training_documents():
    assert _book_split("chesterton-thursday.txt") == "test"
    assert _book_split("austen-persuasion.txt") == "valid"
    assert _book_split("shakespeare-hamlet.txt") == "skip"
    assert _book_split("austen-emma.txt") == "train"
    assert _python_split("howto/logging.html") == "test"
    assert _python_split("faq/general.html") == "valid"
    assert _python_split("library/json.html") == "train"
    genres = {s.genre for s in SOURCES}
    assert {"fiction", "technical", "encyclopedic"} <= genres


def test_wordnet_synsets_read_as_dictionary_entries(tmp_path):
    root = tmp_path / "wordnet-base/usr/share/wordnet"
    root.mkdir(parents=True)
    header = "  1 This software and database is being provided to you, the LICENSEE, by  \n"
    entry = (
        "02084071 05 n 03 dog 0 domestic_dog 0 Canis_familiaris 0 001 @ 02083346 n 0000 | a member of the genus "
        'Canis; "the dog barked all night"  \n'
    )
    (root / "data.noun").write_text(header + entry, encoding="utf-8")
    for pos in ("verb", "adj", "adv"):
        (root / f"data.{pos}").write_text(header, encoding="utf-8")
    documents = dict(_wordnet(tmp_path, tmp_path))
    assert documents["data.noun/0"] == (
        'dog, domestic dog, Canis familiaris (n.): a member of the genus Canis; "the dog barked all night"\n'
    )
    assert "LICENSEE" not in "".join(documents.values())
