"""An HTML page as readable text with its links numbered, by the standard library's html.parser.

    page = html_to_text(html, base_url)  # Page(title, text, links=[(label, absolute URL), ...])
    page.render(max_chars)               # title, URL, text with [n] markers, then the links

What is kept: the title, the text of the body with a line break at each block element (p, div, li,
headings, table rows...), "- " before a list item and "#" before a heading; each link's text is
followed by its number, [n], and the list of links below gives each number its absolute URL, so that
an agent can follow link n (visit[n]). What is dropped: script, style, noscript, template and svg
elements, links that lead nowhere an agent can go (javascript:, mailto:, a bare #fragment), and
repeated blank lines. An href is resolved against the page's URL (or its <base href>); the same URL
linked twice keeps its first number.

HTML that html.parser cannot read to the end (it raises on a few malformed constructs, e.g.
"<![foo") is not an error: the text read up to there is kept and the rest is read with its tags
stripped, and `Page.note` says so.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from html import unescape
from html.parser import HTMLParser
from urllib.parse import urldefrag, urljoin

SKIPPED = {"script", "style", "noscript", "template", "svg"}
BLOCKS = {"p", "div", "br", "li", "tr", "table", "section", "article", "header", "footer", "nav",
          "main", "aside", "ul", "ol", "dl", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6", "pre",
          "blockquote", "form", "hr", "figure", "figcaption", "address", "body", "title"}
HEADINGS = {"h1": "# ", "h2": "## ", "h3": "### ", "h4": "#### ", "h5": "##### ", "h6": "###### "}
_TAG = re.compile(r"<[^>]*>?")
_BLANKS = re.compile(r"\n\s*\n+")
_SPACES = re.compile(r"[ \t\r\f\v]+")


@dataclass
class Page:
    """A page read for an agent: its title, its text with [n] after each link's text, its links."""
    url: str
    title: str = ""
    text: str = ""
    links: list[tuple[str, str]] = field(default_factory=list)   # (label, absolute URL); n at n - 1
    note: str = ""   # what was odd about the page (cut at the size cap, HTML that did not parse)

    def render(self, max_chars: int) -> str:
        """The page as an observation of at most about `max_chars` characters: title, URL, note,
        text, links. The links list keeps at most half the budget (it is what an agent follows
        next); the text gets the rest, cut with a note saying how much was left out."""
        head = f"Title: {self.title or '(none)'}\nURL: {self.url}\n"
        head += f"({self.note})\n" if self.note else ""
        listed, links = 0, ""
        for number, (label, url) in enumerate(self.links, start=1):
            line = f"[{number}] {label or '(no text)'}: {url}\n"
            if len(links) + len(line) > max_chars // 2:
                links += f"({len(self.links) - listed} more links not listed)\n"
                break
            links, listed = links + line, listed + 1
        links = "\n\nLinks:\n" + links.rstrip("\n") if links else ""
        room, text = max_chars - len(head) - 1 - len(links), self.text
        if len(text) > room:
            kept = max(0, room - 60)   # (the note below takes at most 60 characters)
            left = len(text) - kept
            text = text[:kept].rstrip() + f"\n(... {left:,} more characters of this page not shown)"
        return head + "\n" + text + links


def html_to_text(html: str, url: str) -> Page:
    """The readable text and numbered links of `html`, a page fetched from `url`."""
    reader = _Reader(url)
    try:
        reader.feed(html)
        reader.close()
        note = ""
    except Exception:   # (AssertionError, among others, on a few malformed constructs)
        reader.text_parts.append("\n" + strip_tags(html[reader.read_up_to(html):]))
        note = "its HTML did not parse to the end; the rest is shown with its tags stripped"
    text = _SPACES.sub(" ", "".join(reader.text_parts))
    text = _BLANKS.sub("\n\n", "\n".join(line.strip() for line in text.split("\n"))).strip()
    title = " ".join(unescape("".join(reader.title_parts)).split())
    return Page(url=url, title=title, text=text, links=reader.links, note=note)


def strip_tags(html: str) -> str:
    """The text of `html`, every tag removed and entities decoded (for HTML that did not parse)."""
    return unescape(_TAG.sub(" ", html))


class _Reader(HTMLParser):
    """Collects the text (with [n] after each link), the title and the links of one page."""

    def __init__(self, url: str):
        super().__init__(convert_charrefs=True)
        self.base = url
        self.text_parts: list[str] = []
        self.title_parts: list[str] = []
        self.links: list[tuple[str, str]] = []
        self._numbers: dict[str, int] = {}
        self._skip = 0              # depth inside skipped elements
        self._in_title = False
        self._link: tuple[str, list[str]] | None = None   # (URL, text so far) of the <a> being read

    def read_up_to(self, html: str) -> int:
        """The offset in `html` where the parser stopped (from its line and column)."""
        line, column = self.getpos()
        lines = html.split("\n")
        return min(len(html), sum(len(x) + 1 for x in lines[:line - 1]) + column)

    def handle_starttag(self, tag, attrs):
        if tag == "title":
            self._in_title = True
        elif tag == "base" and dict(attrs).get("href"):
            self.base = urljoin(self.base, dict(attrs)["href"])
        if tag in SKIPPED:
            self._skip += 1
            return
        if self._skip:
            return
        if tag in BLOCKS:
            self.text_parts.append("\n")
        if tag == "li":
            self.text_parts.append("- ")
        elif tag in HEADINGS:
            self.text_parts.append(HEADINGS[tag])
        elif tag in ("td", "th"):
            self.text_parts.append(" | ")
        elif tag == "a":
            href = (dict(attrs).get("href") or "").strip()
            target = urldefrag(urljoin(self.base, href))[0] if href else ""
            if target.lower().startswith(("http://", "https://")) and not href.startswith("#"):
                self._link = (target, [])
        elif tag == "img" and dict(attrs).get("alt"):
            self.text_parts.append(f" [image: {dict(attrs)['alt']}] ")

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False
        if tag in SKIPPED:
            self._skip = max(0, self._skip - 1)
            return
        if self._skip:
            return
        if tag == "a" and self._link is not None:
            url, words = self._link
            self._link = None
            if url not in self._numbers:
                self.links.append((" ".join("".join(words).split())[:120], url))
                self._numbers[url] = len(self.links)
            self.text_parts.append(f" [{self._numbers[url]}]")
        if tag in BLOCKS:
            self.text_parts.append("\n")

    def handle_data(self, data):
        if self._in_title:
            self.title_parts.append(data)
            return
        if self._skip:
            return
        self.text_parts.append(data)
        if self._link is not None:
            self._link[1].append(data)
