"""The HTTP shell: the client connection protocol, listeners, middleware, body reading, the
writer, admission, drain, the stream lifecycle and the route handlers. Nothing below imports it.
"""
