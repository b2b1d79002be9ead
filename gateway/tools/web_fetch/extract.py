"""A fetched body's readable text: HTML through lexbor (selectolax), text as is.

HTML is parsed by lexbor, a C implementation of the WHATWG parsing algorithm, through
selectolax's binding (MIT; see docs/dependencies.md): the tree a browser would build, so a page
reads as it renders; ``script``, ``style``, ``template`` and the other elements that show no text
are dropped, block elements start a line, and each line's whitespace is collapsed. The title is
the ``<title>`` element's text.

Bounded CPU on hostile HTML. The HTML tree-construction algorithm walks the stack of open
elements for many start tags ("is a ``p`` in button scope?"), so its cost grows with the
number of tags times the nesting depth: 100,000 nested ``<div>`` (500 KB) take lexbor over a
minute. So before parsing, the input is cut to :data:`MAX_HTML_BYTES` and a linear scan
(:func:`_nesting_cut`) follows the nesting the parser will build, erring towards deeper: where it
passes :data:`MAX_DEPTH`, the document is cut (what lies deeper is not read). Real pages nest
a few dozen levels. The parse is then at most about ``tags x MAX_DEPTH`` steps; measured here,
a cut hostile page costs well under a second. Callers run :func:`html_text` in a thread.
"""

from __future__ import annotations

import codecs
import re

from selectolax.lexbor import LexborHTMLParser

__all__ = ["MAX_DEPTH", "MAX_HTML_BYTES", "decode", "html_text", "plain_text"]

MAX_HTML_BYTES = 1024 * 1024  # of HTML parsed, at most
MAX_DEPTH = 256  # nesting of elements followed, at most

# elements whose text is not the page's
_HIDDEN = ["script", "style", "noscript", "template", "svg", "math", "iframe", "object", "head"]
# tags (open or close) that start a line of text; a line break is marked in the source
_BLOCK_TAG = re.compile(
    r"<(?=/?(?:address|article|aside|blockquote|br|dd|details|dialog|div|dl|dt|fieldset|"
    r"figcaption|figure|footer|form|h[1-6]|header|hr|li|main|nav|ol|p|pre|section|summary|"
    r"table|tr|ul)[\s/>])",
    re.I,
)
_CELL_TAG = re.compile(r"<(?=t[dh][\s/>])", re.I)
_PRE = re.compile(r"<pre[\s>].*?(?:</pre\s*>|\Z)", re.S | re.I)
_BREAK = "\ue000"  # a private-use character: where a line breaks in the rendered text
_META_CHARSET = re.compile(
    rb"""<meta[^>]{0,200}?charset\s*=\s*["']?\s*([a-zA-Z0-9_.:-]{1,40})""", re.I
)
_WHITESPACE = re.compile(r"[\s\u00a0\u2000-\u200b\u3000]+")
_BLANK_LINES = re.compile(r"\n{3,}")
# C0/C1 controls but tab and newline, lone surrogates: never in a document
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")

# the nesting scan: a comment, a raw-text element's whole content, or a tag
_TOKEN = re.compile(
    r"<!--.*?(?:-->|\Z)"
    r"|<(script|style|textarea|title|xmp|iframe|noembed|noframes|noscript)\b.*?(?:</\1\s*>|\Z)"
    r"|<(/?)([a-zA-Z][^\s/>]*)[^>]*?(/?)>",
    re.S | re.I,
)
_VOID = frozenset(
    "area base br col embed hr img input link meta param source track wbr keygen basefont "
    "bgsound frame image".split()
)
# an open one of these closes an open one of the same group above the nearest boundary
_IMPLIED = {
    "p": "p",
    "li": "li",
    "dt": "d",
    "dd": "d",
    "option": "option",
    "tr": "tr",
    "td": "td",
    "th": "td",
    "rb": "r",
    "rt": "r",
    "rp": "r",
}
_LOOK = 16  # stack entries a tag looks at: past them, it is taken to close nothing
_BOUNDARY = frozenset(
    "html table td th caption template applet object marquee button ul ol select svg math".split()
)


def _nesting_cut(text: str, limit: int = MAX_DEPTH) -> str:
    """``text`` cut where its elements' nesting passes ``limit`` (whole if it never does).

    Cost linear in ``text``: each tag looks at no more than :data:`_LOOK` entries of the
    stack. The scan mirrors the parser's stack of open elements loosely and errs towards
    deeper: a close tag pops only what it names among the top entries, and not past a scope
    boundary; a void element, or a self-closed one inside ``svg``/``math``, is not pushed;
    ``p``, ``li``, table rows and cells and the like close their own kind."""
    stack: list[str] = []
    foreign = 0  # svg/math elements open
    implied = _IMPLIED
    boundary = _BOUNDARY
    for match in _TOKEN.finditer(text):
        close, name, selfclosed = match.group(2, 3, 4)
        if name is None:
            continue
        name = name.lower()
        if close:
            for i in range(len(stack) - 1, max(len(stack) - _LOOK, 0) - 1, -1):
                if stack[i] == name:
                    if foreign:
                        foreign -= sum(1 for n in stack[i:] if n in ("svg", "math"))
                    del stack[i:]
                    break
                if stack[i] in boundary:
                    break
            continue
        if name in _VOID or (selfclosed and foreign):
            continue
        group = implied.get(name)
        if group is not None:
            for i in range(len(stack) - 1, max(len(stack) - _LOOK, 0) - 1, -1):
                if implied.get(stack[i]) == group:
                    del stack[i:]
                    break
                if stack[i] in boundary:
                    break
        stack.append(name)
        if name in ("svg", "math"):
            foreign += 1
        if len(stack) > limit:
            return text[: match.start()]
    return text


def decode(body: bytes, charset: str | None, *, html: bool = False) -> str:
    """``body`` as text: a BOM first, then ``charset`` (the header's), then for HTML a
    ``<meta charset>`` in the first kilobytes, else UTF-8; undecodable bytes replaced."""
    for bom, name in (
        (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"),
        (codecs.BOM_UTF16_BE, "utf-16"),
    ):
        if body.startswith(bom):
            return body.decode(name, errors="replace")
    names = [charset] if charset else []
    if html:
        found = _META_CHARSET.search(body[:4096])
        if found:
            names.append(found.group(1).decode("ascii", "replace"))
    for name in names:
        try:
            if codecs.lookup(name).name in ("utf-7",):  # would turn "+ADw-" into "<"
                continue
            return body.decode(name, errors="replace")
        except (LookupError, ValueError):
            continue
    return body.decode("utf-8", errors="replace")


def _marked(source: str) -> str:
    """``source`` with a :data:`_BREAK` before each tag that starts a line and in place of
    each newline inside ``<pre>``, a space before each table cell: the parser keeps them in
    the text nodes, so one regex pass does what a walk of the tree per element would."""
    source = source.replace(_BREAK, "")
    source = _PRE.sub(lambda m: m.group(0).replace("\n", _BREAK), source)
    source = _BLOCK_TAG.sub(_BREAK + "<", source)
    return _CELL_TAG.sub(" <", source)


def _lines(text: str, max_chars: int) -> str:
    """Rendered text: whitespace runs one space, a line per :data:`_BREAK`, no blank lines
    but one in a row, no control characters; at most ``max_chars`` characters."""
    text = _UNPRINTABLE.sub("", text[: max_chars * 4 + 4096])
    lines = (line.strip() for line in _WHITESPACE.sub(" ", text).split(_BREAK))
    out: list[str] = []
    for line in lines:
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip()[:max_chars]


def html_text(body: bytes, charset: str | None, *, max_chars: int) -> tuple[str | None, str]:
    """(title, readable text) of an HTML page, the text at most ``max_chars`` characters."""
    source = _nesting_cut(decode(body[:MAX_HTML_BYTES], charset, html=True))
    tree = LexborHTMLParser(_marked(source))
    node = tree.css_first("title")
    title = _lines(node.text(deep=True), 1000).replace("\n", " ") if node is not None else ""
    root = tree.body
    if root is None:
        return title or None, ""
    root.strip_tags(_HIDDEN, recursive=True)
    return title or None, _lines(root.text(deep=True, separator=""), max_chars)


def plain_text(body: bytes, charset: str | None, *, max_chars: int) -> str:
    """A text body as text (its lines kept), at most ``max_chars`` characters."""
    text = decode(body[: max_chars * 4 + 4096], charset)
    text = _UNPRINTABLE.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    return text[:max_chars]
