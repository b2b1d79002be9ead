"""Message Batches: durable batches of Messages requests, run on idle upstream capacity.

``schema`` (tables, rows, StoreError), ``engines`` (SQLite and PostgreSQL engines),
``store`` (the operations, one SQL layer), ``scheduler`` (interactive traffic first; each
request one buffered call through :mod:`gateway.messages.call`). The routes are
:mod:`gateway.http.batches`.
"""
