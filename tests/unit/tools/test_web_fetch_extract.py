"""A fetched page's readable text (gateway/tools/web_fetch/extract.py).

HTML is parsed as a browser would (lexbor); what shows no text is dropped, blocks start
lines. The parser's work grows with tags times nesting depth, so a page nested deeper than
``MAX_DEPTH`` is cut where it passes it, and only there: real pages' shapes (many closed
blocks, unclosed ``<p>``/``<li>``, void elements, inline SVG) are read whole.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from selectolax.lexbor import LexborHTMLParser

from gateway.tools.web_fetch.extract import (
    MAX_DEPTH,
    MAX_HTML_BYTES,
    MAX_TAGS,
    html_text,
    nesting_cut,
    plain_text,
)


@pytest.mark.parametrize(
    ("html", "title", "text"),
    [
        (
            "<html><head><title> A  page </title><style>p{}</style></head>"
            "<body><p>Hello <b>bold</b>\n  world</p><div>a<br>b</div></body></html>",
            "A page",
            "Hello bold world\n\na\nb",
        ),
        ("<p>one<p>two", None, "one\ntwo"),  # unclosed p: the parser closes it
        ("<ul><li>x<li>y</ul>", None, "x\ny"),
        ("<table><tr><td>c1<td>c2</table>", None, "c1 c2"),
        ("<pre>line 1\n  line 2</pre>", None, "line 1\nline 2"),
        (
            "<body><script>alert('no')</script><noscript>no</noscript><template>no</template>"
            "<svg><text>no</text></svg>visible<iframe>no</iframe></body>",
            None,
            "visible",
        ),
        ("<p>a&amp;b &lt;tag&gt; caf&eacute;</p>", None, "a&b <tag> café"),
        ("<p>tab\tand\u00a0nbsp</p>", None, "tab and nbsp"),
        ("<p>ctrl\x01\x1b[31m</p>", None, "ctrl[31m"),
        ("", None, ""),
        ("just text", None, "just text"),
        ("<title>only a title</title>", "only a title", ""),
    ],
)
def test_html_text(html: str, title: str | None, text: str) -> None:
    assert html_text(html.encode(), "utf-8", max_chars=10_000) == (title, text)


def test_max_chars_bounds_the_text() -> None:
    _, text = html_text(b"<p>" + b"word " * 10_000, None, max_chars=100)
    assert len(text) == 100


@pytest.mark.parametrize(
    ("body", "charset", "expected"),
    [
        ("<p>caf\u00e9</p>".encode("latin-1"), "iso-8859-1", "café"),
        ('<meta charset="windows-1252"><p>caf\u00e9</p>'.encode("cp1252"), None, "café"),
        (
            "<meta http-equiv=Content-Type content='text/html; charset=koi8-r'><p>да</p>".encode(
                "koi8-r"
            ),
            None,
            "да",
        ),
        (b"\xef\xbb\xbf<p>bom</p>", "iso-8859-1", "bom"),  # a BOM wins over the header
        ("<p>utf16</p>".encode("utf-16"), None, "utf16"),
        ("<p>caf\u00e9</p>".encode(), "no-such-charset", "café"),  # unknown: UTF-8
        ("<p>caf\u00e9</p>".encode(), "base64", "café"),  # not a text encoding: UTF-8
        (b"<p>+ADw-script+AD4-</p>", "utf-7", "+ADw-script+AD4-"),  # UTF-7 is not honoured
        (b"<p>bad \xff\xfe bytes</p>", "utf-8", "bad \ufffd\ufffd bytes"),
    ],
)
def test_charsets(body: bytes, charset: str | None, expected: str) -> None:
    assert html_text(body, charset, max_chars=1000)[1] == expected


DEEP = MAX_DEPTH + 10


@pytest.mark.parametrize(
    "html",
    [
        "<p>top</p>" + "<div>" * DEEP + "deep",
        "<p>top</p>" + "<div></x>" * DEEP + "deep",  # close tags of nothing open pop nothing
        "<p>top</p>" + "<div><!--</div>-->" * DEEP + "deep",  # nor do close tags in comments
        "<p>top</p>" + "<div><script></div></script>" * DEEP + "deep",  # nor in raw text
        "<p>top</p>" + "<div/>" * DEEP + "deep",  # self-closing syntax opens an HTML element
        "<p>top</p>" + "<b><i>" * DEEP + "deep",
        "<p>top</p>" + "<table><tr><td>" * DEEP + "deep",
        # what a loose scan would take for an end tag, or would not see as a start tag:
        "<p>top</p>" + "<x><div></x>" * DEEP + "deep",  # </x> does not pop past a div
        "<p>top</p>" + '<div title="a>b</div>">' * DEEP + "deep",  # ">" in a quoted value
        "<p>top</p>" + "<!--><div>" * DEEP + "deep",  # "<!-->" is a whole comment
        "<p>top</p>" + "<!---><div>" * DEEP + "deep",
        "<p>top</p>" + "<div><!x</div>" * DEEP + "deep",  # a bogus comment ends at ">"
        "<p>top</p>" + "<div><?x</div>" * DEEP + "deep",
        "<p>top</p>" + "<div><script>s</script x>" * DEEP + "deep",  # the script ends
        "<p>top</p>" + "<div><script-x></script-x>" * DEEP + "deep",  # not a script
        "<p>top</p>" + '<div x"><div>' * DEEP + "deep",  # a quote in a name opens nothing
        "<p>top</p>" + "<li><section>" * DEEP + "deep",  # li does not close past section
        "<p>top</p>" + "<option><b>" * DEEP + "deep",  # option closes only the current node
        "<p>top</p>" + "<div></body></html>" * DEEP + "deep",  # these pop nothing
        "<p>top</p>" + "<div><form></form>" * DEEP + "deep",
    ],
    ids=lambda html: html[10:40],
)
def test_nesting_past_the_limit_is_cut_there(html: str) -> None:
    """Each shape nests past MAX_DEPTH in the parser's tree (which costs it tags x depth)."""
    _, text = html_text(html.encode(), None, max_chars=100_000)
    assert text.startswith("top")
    assert "deep" not in text


@pytest.mark.parametrize(
    "html",
    [
        "<div>" * (MAX_DEPTH - 10) + "end",
        "<div><p>x</p></div>" * 5000 + "end",
        "<p>unclosed" * 5000 + "end",
        "<ul>" + "<li>unclosed" * 5000 + "</ul>end",
        "<dl>" + "<dt>t<dd>d" * 2000 + "</dl>end",
        "<table>" + "<tr><td>a<td>b" * 2000 + "</table>end",
        "<select>" + "<option>o" * 2000 + "</select>end",
        "<p>" + "line<br>" * 5000 + "<img src=x><hr><input>end",
        "<svg>" + "<path d='M0'/>" * 5000 + "</svg>end",
        "<div><span>open inline</div>" * 2000 + "end",  # the close pops past the span
        "<div title=\"a>b\" data-x='</div>'>x</div>" * 2000 + "end",
        "<!DOCTYPE html><!-- a > b --><div>x</div>" * 2000 + "end",
        "<script>var s = '</div>';</script><div>x</div>" * 2000 + "end",
        "<div><b>bold</b><i>it</i><a href=x>link</a></div>" * 2000 + "end",
        "<section><h1>t</h1><ul><li><a>x</a></li></ul></section>" * 2000 + "end",
        "<form><input><select><option>a<option>b</select></form>" * 2000 + "end",
    ],
    ids=lambda html: html[:30],
)
def test_real_shapes_are_read_whole(html: str) -> None:
    _, text = html_text(html.encode(), None, max_chars=1_000_000)
    assert text.endswith("end")


@pytest.mark.parametrize(("spans", "kept"), [(MAX_TAGS - 1, True), (MAX_TAGS, False)])
def test_start_tags_past_max_tags_are_not_parsed(spans: int, kept: bool) -> None:
    """The hard bound behind the nesting scan: what follows the MAX_TAGS-th start tag is
    not parsed, however flat the page."""
    html = "<span>x</span>" * spans + "<p>after</p>"
    _, text = html_text(html.encode(), None, max_chars=10**7)
    assert ("after" in text) is kept


def test_input_past_the_cap_is_not_parsed() -> None:
    html = b"<p>" + b"a" * MAX_HTML_BYTES + b"</p><p>after the cap</p>"
    _, text = html_text(html, None, max_chars=10 * MAX_HTML_BYTES)
    assert "after the cap" not in text
    assert len(text) == MAX_HTML_BYTES - 3


@pytest.mark.parametrize(
    ("body", "charset", "text"),
    [
        (b"line 1\r\nline 2\rline 3\n", None, "line 1\nline 2\nline 3\n"),
        ("caf\u00e9".encode("latin-1"), "latin-1", "café"),
        (b"nul\x00 and esc\x1b kept out", None, "nul and esc kept out"),
        (b"\xef\xbb\xbfbom", None, "bom"),
        (b"<p>not parsed</p>", None, "<p>not parsed</p>"),
    ],
)
def test_plain_text(body: bytes, charset: str | None, text: str) -> None:
    assert plain_text(body, charset, max_chars=1000) == text


def test_plain_text_max_chars() -> None:
    assert plain_text(b"x" * 10_000, None, max_chars=10) == "x" * 10


# tokens an attacker mixes: nesting, end tags that pop or not, and every context where a
# loose scan would misread an end tag (comments, quotes, raw text, CDATA, bogus comments)
_PIECES = [
    "<div>", "</div>", "<p>", "</p>", "<li>", "</li>", "<ul>", "</ul>", "<dd>", "<dt>",
    "<b>", "</b>", "<a>", "</a>", "<x>", "</x>", "<span>", "</span>", "<section>",
    "</section>", "<table>", "</table>", "<tr>", "<td>", "</td>", "<option>", "<select>",
    "</select>", "<form>", "</form>", "<h1>", "</h2>", "</body>", "</html>", "<svg>",
    "</svg>", "<path/>", "<div/>", "<math>", "<!--", "-->", "<!-->", "--!>", "<!x", "<?",
    "</ ", "<![CDATA[", "]]>", "<script>", "</script>", "</script x>", "<style>",
    "</style>", "<textarea>", "</textarea>", "<title>", '<i title="', "<i title='", "'",
    '"', ">", "=", " ", "<br>", "<img>", "<template>", "</template>", "<button>", "<noscript>",
    "</noscript>", "<plaintext>", "text",
]  # fmt: skip


def _depth(html: str) -> int:
    """The deepest element of the tree lexbor builds (html is 1)."""
    tree = LexborHTMLParser(html)
    deepest = 0
    for node in tree.root.traverse(include_text=False) if tree.root else ():
        depth, parent = 0, node
        while parent is not None and depth < 10_000:
            depth, parent = depth + 1, parent.parent
        deepest = max(deepest, depth)
    return deepest


@settings(max_examples=600, deadline=None, derandomize=True)
@given(
    st.lists(st.sampled_from(_PIECES), max_size=30),
    st.lists(st.sampled_from(_PIECES), min_size=1, max_size=6),
)
def test_what_the_scan_lets_through_is_no_deeper_than_its_limit(
    prefix: list[str], unit: list[str]
) -> None:
    """What the scan keeps nests no deeper than a constant times its limit, whatever the
    attacker's mix: the parser's cost stays tags x depth. (The constant is 2: the parser adds
    elements of its own, a tbody and a tr around a bare td, that the scan does not count.)
    An attack repeats a unit, so the input is a prefix and a unit 60 times."""
    kept = nesting_cut("".join(prefix) + "".join(unit) * 60, limit=20)
    assert _depth(kept) <= 2 * 20 + 4
