"""PDF documents -> text, page by page, in worker processes bounded in CPU.

In: a request's PDF blocks. Out: the request with those blocks as text.
"""
