"""Child processes that die with their parent.

A SIGKILLed gateway runs no cleanup: its PDF workers, its body decoder and (``--workers``)
the gateway workers of a killed supervisor went on, holding memory, CPU and a request body
nobody would read. On Linux a child asks the kernel to signal it when its parent dies
(``prctl(PR_SET_PDEATHSIG)``, via ctypes: no extra dependency). The request is tied to the
parent *thread* that forked the child (here always the one running the event loop, or the
supervisor's only thread), survives ``execve``, and is lost if the parent died before it
was made: the child checks its parent pid right after, and exits if it was reparented.
Elsewhere each child also watches its pipe from the parent (the PDF worker reads its stdin
on a thread, the decoder its call queue) and exits at end of file.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def _find_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _find_prctl()  # resolved before any fork: a preexec_fn only calls it


def die_with_parent(parent: int | None = None, sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent dies; exit at once if
    the parent (``parent``, or the one this process has now) is already gone. -> whether
    the kernel took the request (False where there is no prctl)."""
    expected = os.getppid() if parent is None else parent
    armed = _PRCTL is not None and _PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    if os.getppid() != expected:
        os._exit(1)
    return armed
