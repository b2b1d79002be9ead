"""systemd's service notification protocol, without libsystemd (``sd_notify(3)``).

Under ``Type=notify`` systemd passes ``$NOTIFY_SOCKET``, the address of a unix datagram
socket, and counts the service as started when ``READY=1`` arrives there; ``STOPPING=1``
says a stop has begun. Each message is one datagram of ``KEY=value`` lines. An address
starting with ``@`` is in the abstract namespace (the ``@`` stands for a leading NUL byte).
As ``sd_notify`` does, a missing variable or a failed send is not an error: the gateway
runs the same outside systemd.

What the gateway sends, and when:

- one process: ``READY=1`` once the API listener (and the metrics listener, if apart) is
  bound and listening and SIGTERM is handled (a drain), so a connection made when systemd
  reports the unit started is accepted; ``STOPPING=1`` when the drain starts.
- ``--workers N``: the supervisor is the main process and the only one that talks to
  systemd (``NotifyAccess=main``). Each worker gets ``NOTIFY_SOCKET`` pointing at a socket
  of the supervisor's (abstract, with the sender's credentials checked) and says
  ``READY=1`` as above; the supervisor says ``READY=1`` once every worker has, and
  ``STOPPING=1`` when it forwards SIGTERM (gateway/ops/workers.py).
"""

from __future__ import annotations

import socket


def _address(name: str) -> str:
    return "\0" + name[1:] if name.startswith("@") else name


class Notifier:
    """Sends state lines to ``$NOTIFY_SOCKET``; does nothing when it is unset."""

    __slots__ = ("address",)

    def __init__(self, notify_socket: str | None) -> None:
        self.address = _address(notify_socket) if notify_socket else None

    def send(self, state: str) -> bool:
        """One datagram (e.g. ``"READY=1"``); whether it was sent."""
        if self.address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(self.address)
                sock.send(state.encode())
        except OSError:
            return False
        return True
