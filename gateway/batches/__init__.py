"""Message Batches: durable batches of Messages requests, run on idle upstream capacity.

``store`` (one SQL layer, SQLite or PostgreSQL), ``execute`` (one batch request as a buffered
Messages call), ``scheduler`` (interactive traffic first), ``api`` (the routes).
"""
