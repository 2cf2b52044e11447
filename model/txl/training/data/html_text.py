"""HTML documentation -> the plain text a reader sees: paragraphs, headings, lists and code blocks, no navigation.

Sphinx (the Python documentation) and DocBook (the PostgreSQL manual) pages wrap the text in navigation bars,
sidebars, footers and permalink anchors (`¶`); those are skipped, because every page repeats them and a model would
spend its capacity on boilerplate. Block elements become paragraphs separated by a blank line; `<pre>` keeps its
lines and indentation, as documentation shows code.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

_BLOCKS = {
    "p", "div", "section", "h1", "h2", "h3", "h4", "h5", "h6", "li", "dt", "dd", "tr", "table", "ul", "ol", "dl",
    "blockquote", "pre", "br", "hr", "caption", "figure", "figcaption",
}  # fmt: skip
_SKIPPED_TAGS = {"script", "style", "head", "nav", "title", "noscript"}
# Navigation and boilerplate in Sphinx and DocBook pages (class names of the elements to leave out whole).
_SKIPPED_CLASSES = {
    "related", "sphinxsidebar", "footer", "headerlink", "navheader", "navfooter", "toc", "breadcrumb",
    "clearer", "highlight-none-notranslate",
}  # fmt: skip
_VOID = {"br", "hr", "img", "meta", "link", "input", "area", "base", "col", "embed", "source", "wbr"}


class _TextExtractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[str] = []
        self.current: list[str] = []
        self.stack: list[tuple[str, bool]] = []  # (tag, opened a skipped region)
        self.skip_depth = 0
        self.pre_depth = 0

    def _end_block(self) -> None:
        text = "".join(self.current)
        self.current = []
        text = text.strip("\n") if self.pre_depth else re.sub(r"\s+", " ", text).strip()
        if text:
            self.blocks.append(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = set((dict(attrs).get("class") or "").split())
        skips = tag in _SKIPPED_TAGS or bool(classes & _SKIPPED_CLASSES)
        if tag in _VOID:
            if tag == "br" and not self.skip_depth:
                self.current.append("\n" if self.pre_depth else " ")
            return
        if not self.skip_depth and tag in _BLOCKS:
            self._end_block()
        if tag == "pre":
            self.pre_depth += 1
        self.stack.append((tag, skips))
        self.skip_depth += skips

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID or not any(t == tag for t, _ in self.stack):
            return
        while self.stack:  # close whatever the page left open inside this element
            open_tag, skipped = self.stack.pop()
            if not self.skip_depth and open_tag in _BLOCKS:
                self._end_block()
            self.skip_depth -= skipped
            if open_tag == "pre":
                self.pre_depth -= 1
            if open_tag == tag:
                break

    def handle_data(self, data: str) -> None:
        if not self.skip_depth:
            self.current.append(data)


def html_to_text(html: str) -> str:
    """One HTML page -> its text, blocks separated by blank lines (empty string for a page with no text)."""
    parser = _TextExtractor()
    parser.feed(html)
    parser.close()
    parser._end_block()
    return "\n\n".join(parser.blocks) + "\n" if parser.blocks else ""
