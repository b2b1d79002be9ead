"""A fetched body's readable text: HTML through lexbor (selectolax), text as is.

HTML is parsed by lexbor, a C implementation of the WHATWG parsing algorithm, through
selectolax's binding (MIT; see docs/dependencies.md): the tree a browser would build, so a page
reads as it renders; ``script``, ``style``, ``template`` and the other elements that show no text
are dropped, block elements start a line, and each line's whitespace is collapsed. The title is
the ``<title>`` element's text.

Bounded CPU on hostile HTML. The tree-construction algorithm walks the stack of open
elements for the block start tags ("is a ``p`` in button scope?"), so its cost grows with
those tags times the nesting depth: 100,000 nested ``<div>`` (500 KB) take lexbor over a
minute (nested ``<span>``, ``<b>`` or custom elements cost nothing like it). So before parsing,
the input is cut to :data:`MAX_HTML_BYTES` and a linear scan (:func:`nesting_cut`) follows the
nesting the parser will build: it reads tokens as the tokenizer does wherever a mistake would
let an attacker hide a start tag or fake an end tag (comments, bogus comments, quoted
attribute values, raw text), follows the tree builder loosely, erring towards deeper, and
cuts the document where the depth passes :data:`MAX_DEPTH` (what lies deeper is not read).
Real pages nest a few dozen levels. The scan is a model of the tree builder, and a model
can be fooled (a fuzz test finds rare mixes of ``select``, ``table`` and CDATA that nest about
one level a repetition deeper than it counts), so a hard bound stands behind it: at most
:data:`MAX_TAGS` start tags are parsed, which bounds the depth, and so the cost, whatever the
scan judged. Measured on this machine, a 1 MiB hostile page costs about 0.1 s
(the scan a Python step per tag) and at most about 0.4 s were the scan fooled outright
(20,000 nested blocks); callers run :func:`html_text` in a thread.
"""

from __future__ import annotations

import codecs
import re

__all__ = [
    "MAX_DEPTH",
    "MAX_HTML_BYTES",
    "MAX_TAGS",
    "decode",
    "html_text",
    "nesting_cut",
    "plain_text",
]

MAX_HTML_BYTES = 1024 * 1024  # of HTML parsed, at most
MAX_DEPTH = 256  # nesting of elements followed, at most
MAX_TAGS = 20_000  # start tags parsed, at most: 20,000 nested <div> cost lexbor ~0.4 s here

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

# the nesting scan, token by token as the HTML tokenizer reads them: a comment (``<!-->`` and
# ``<!--->`` end at once, others at ``-->`` or ``--!>``); a bogus comment, doctype or CDATA
# (``<!``, ``<?``, ``</`` and no letter: to the first ``>``); a tag with its attributes, quoted
# values holding ``>`` included (atomic: no backtracking; an unclosed one runs to the end)
_WS = r"[\t\n\f\r ]"
_TAG_START = re.compile(r"<[a-zA-Z]")
_ATTR = (
    rf"""(?>[^\t\n\f\r />][^\t\n\f\r />=]*(?:{_WS}*={_WS}*(?:"[^"]*"|'[^']*'|[^\t\n\f\r >]*))?)"""
)
_TOKEN = re.compile(
    r"<!--(?:>|->|.*?(?:--!?>|\Z))"
    r"|<(?:!|\?|/(?![a-zA-Z]))(\[CDATA\[)?[^>]*+(?:>|\Z)"
    rf"|<(/?)([a-zA-Z][^\t\n\f\r />]*+)(?>(?:{_WS}|/)*+(?:{_ATTR}(?:{_WS}|/)*+)*+)(?:>|\Z)",
    re.S,
)
# elements whose content is text to the first end tag of their name
_RAW = frozenset("script style textarea title xmp iframe noembed noframes".split())
_RAW_END = {n: re.compile(rf"</{n}[\t\n\f\r />]", re.I) for n in _RAW}
_ESCAPED = re.compile(r"<!--.*<script[\t\n\f\r />]", re.S | re.I)  # double-escaped script
_VOID = frozenset(
    "area base br col embed hr img input link meta param source track wbr keygen basefont "
    "bgsound frame image".split()
)
_UNCOUNTED = frozenset({"html", "head", "body"})  # opened once; their end tags pop nothing
_REOPENED = frozenset("a b big code em font i nobr s small strike strong tt u".split())
_FORMATTING = _REOPENED | {"form"}  # end tags that pop only the current node
# the standard's "special" elements: an end tag of another name does not pop past them
_SPECIAL = frozenset(
    "address applet area article aside base basefont bgsound blockquote body br button "
    "caption center col colgroup dd details dir div dl dt embed fieldset figcaption figure "
    "footer form frame frameset h1 h2 h3 h4 h5 h6 head header hgroup hr html iframe img input "
    "keygen li link listing main marquee menu meta nav noembed noframes noscript object ol p "
    "param plaintext pre script search section select source style summary table tbody td "
    "template textarea tfoot th thead title tr track ul wbr xmp mi mo mn ms mtext "
    "annotation-xml foreignobject desc".split()
)
# end tags that pop to their element through any other (the rest stop at a special one)
_BLOCK_END = frozenset(
    "address article aside blockquote button center details dialog dir div dl fieldset "
    "figcaption figure footer header hgroup listing main menu nav ol pre search section "
    "summary ul p li dd dt h1 h2 h3 h4 h5 h6 applet marquee object table tbody thead tfoot "
    "tr td th caption colgroup select template".split()
)
# scope boundaries (and a few more: stopping early only counts deeper)
_BOUNDARY = frozenset(
    "html table td th caption template applet object marquee button ul ol select svg math "
    "foreignobject desc mi mo mn ms mtext annotation-xml".split()
)
# a start tag that closes an open one of its group: (group, where the search stops)
_IMPLIED = {
    "p": ("p", _BOUNDARY),
    "li": ("li", _SPECIAL - {"address", "div", "p"}),
    "dt": ("d", _SPECIAL - {"address", "div", "p"}),
    "dd": ("d", _SPECIAL - {"address", "div", "p"}),
    "tr": ("tr", frozenset({"table", "html", "template"})),
    "td": ("td", frozenset({"table", "html", "template", "tr"})),
    "th": ("td", frozenset({"table", "html", "template", "tr"})),
}
# start tags that end svg/math content (font too, with some attributes: taken as always)
_BREAKOUT = frozenset(
    "b big blockquote body br center code dd div dl dt em embed h1 h2 h3 h4 h5 h6 head hr i "
    "img li listing menu meta nobr ol p pre ruby s small span strong strike sub sup table tt "
    "u ul var font".split()
)
# svg and math elements whose content is HTML again (annotation-xml: with an HTML encoding)
_INTEGRATION = {
    "svg": frozenset({"foreignobject", "desc", "title"}),
    "math": frozenset({"mi", "mo", "mn", "ms", "mtext"}),
}
_HTML_ENCODING = re.compile(
    rf"""encoding{_WS}*={_WS}*["']?(?:text/html|application/xhtml\+xml)["'\t\n\f\r />]""",
    re.I,
)
# start tags that close an open p (in button scope) first
_CLOSES_P = frozenset(
    "address article aside blockquote center details dialog dir div dl fieldset figcaption "
    "figure footer form h1 h2 h3 h4 h5 h6 header hgroup hr main menu nav ol pre listing "
    "search section summary ul xmp plaintext li dd dt".split()
)
_TABLE_PARTS = frozenset("tr td th tbody thead tfoot caption col colgroup".split())
_GROUP = {name: group for name, (group, _) in _IMPLIED.items()}
_LOOK = 16  # stack entries a tag looks at: past them, it is taken to close nothing


def _pop_to(stack: list[str], name: str, stop: frozenset[str], group: str | None = None) -> None:
    """Pops ``stack`` to its top-most ``name`` (or member of ``group``), if one is found
    among the top :data:`_LOOK` entries before an entry in ``stop``."""
    low = max(len(stack) - _LOOK, 0)
    for i in range(len(stack) - 1, low - 1, -1):
        entry = stack[i]
        if entry == name or (group is not None and _GROUP.get(entry) == group):
            # a formatting element closed on the way is opened again by the next text or
            # tag (the active formatting elements): it stays counted
            kept = [e for e in stack[i + 1 :] if e in _REOPENED]
            del stack[i:]
            stack += kept
            return
        if entry in stop:
            return


def _tags_cut(text: str) -> str:
    """``text`` cut before its :data:`MAX_TAGS` + 1st start tag: the hard bound, whatever
    the nesting scan misjudges (each start tag begins ``<`` and a letter; counting each such
    pair can only count too many)."""
    for n, match in enumerate(_TAG_START.finditer(text)):
        if n == MAX_TAGS:
            return text[: match.start()]
    return text


def nesting_cut(text: str, limit: int = MAX_DEPTH) -> str:
    """``text`` cut where its elements' nesting passes ``limit`` (whole if it never does).

    Cost linear in ``text``: each tag looks at no more than :data:`_LOOK` entries of the
    stack. The scan follows the tokenizer exactly where a mistake could hide a start tag
    or show an end tag that is not one (comments, attribute values, raw text), and the tree
    builder loosely, erring towards deeper: an end tag pops only what it names, not past a
    scope boundary (nor, for a name that is not special, past a special element; a
    formatting one only from the top); a void element, or a self-closed one inside
    ``svg``/``math``, is not pushed; ``p``, ``li``, table rows and cells close their own kind.
    Where the tokenizer's state cannot be known without the tree (a script holding
    ``<!--`` and ``<script``, CDATA holding markup), no end tag pops anything after it."""
    stack: list[str] = []
    # where svg/math content ("svg", "math") or HTML inside it ("") starts: (stack index, ns)
    ctx: list[tuple[int, str]] = []
    trusted = True  # end tags pop
    pos = 0
    while True:
        match = _TOKEN.search(text, pos)
        if match is None:
            return text
        pos = match.end()
        if match.group(1):  # CDATA: text in svg/math, a bogus comment elsewhere
            close = text.find("]]>", match.start())
            if close < 0 or "<" in text[match.start() + 9 : close] or pos != close + 3:
                trusted = False
            continue
        name = match.group(3)
        if name is None:
            continue
        name = name.lower()
        ns = ctx[-1][1] if ctx else ""
        foreign = bool(ns)
        if match.group(2):  # an end tag
            if not trusted or name in _UNCOUNTED:
                continue
            if foreign and name in ("p", "br"):  # they end svg/math content first
                while ctx and ctx[-1][1]:
                    del stack[ctx.pop()[0] :]
            if name in _FORMATTING:
                if stack and stack[-1] == name:
                    stack.pop()
            else:
                _pop_to(stack, name, _BOUNDARY if name in _BLOCK_END else _SPECIAL)
            while ctx and ctx[-1][0] >= len(stack):
                ctx.pop()
            continue
        if not trusted:  # the tokenizer's state is unknown: every start tag counts
            stack.append(name)
            if len(stack) > limit:
                return text[: match.start()]
            continue
        if foreign:
            if name in _BREAKOUT:  # leaves svg/math: the parser pops its elements
                while ctx and ctx[-1][1]:
                    del stack[ctx.pop()[0] :]
                foreign = False
            elif match.group(0).endswith("/>"):
                continue  # self-closed: a foreign element holds nothing
        if not foreign:
            if name in _RAW:
                end = _RAW_END[name].search(text, pos)
                stop = end.start() if end else len(text)
                if name == "script" and _ESCAPED.search(text, pos, stop):
                    trusted = False  # escaped script data may run past this end tag
                pos = stop
            if name in _VOID or name in _UNCOUNTED:
                continue
            if name in _TABLE_PARTS and "table" not in stack[-_LOOK:]:
                continue  # outside a table the parser ignores them (a far one: unsure)
            if name == "option" and stack and stack[-1] == "option":
                stack.pop()  # an option closes the option that is the current node, only
            implied = _IMPLIED.get(name)
            if implied is not None:  # first, as the parser does (an li looks for an li first)
                _pop_to(stack, name, implied[1], implied[0])
            if name in _CLOSES_P:  # then an open p: else a later <p> would pop more
                _pop_to(stack, "p", _BOUNDARY)
            if implied is not None or name in _CLOSES_P:
                while ctx and ctx[-1][0] >= len(stack):
                    ctx.pop()
        if not foreign and name in ("svg", "math"):
            ctx.append((len(stack), name))
        elif foreign and (
            name in _INTEGRATION[ns]
            or (name == "annotation-xml" and _HTML_ENCODING.search(match.group(0)))
        ):
            ctx.append((len(stack), ""))
        stack.append(name)
        if len(stack) > limit:
            return text[: match.start()]


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
    # imported at the first page (under 2 ms): a gateway that fetches no page keeps its 1.8 MB
    from selectolax.lexbor import LexborHTMLParser

    source = nesting_cut(_tags_cut(decode(body[:MAX_HTML_BYTES], charset, html=True)))
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
