"""When a connection to one upstream may carry a second request: a pure state machine.

HTTP/1.1 gives a reply no request identity: on a keep-alive connection, the next reply to
arrive is taken as the reply to the request sent last. An upstream that answers one request
twice, or answers nobody on an idle connection, puts every later reply on that connection
one request behind, and each client then gets the previous one's answer. Bytes that arrive
while a connection is idle are caught (gateway/upstream/connection.py), but a stray reply
that lands after the next request went out is indistinguishable from its answer, unless the
reply names its request: the gateway sends ``X-Request-Id`` (its own, one per attempt, never
the client's: gateway/text/ids.py) and vLLM (started with ``--enable-request-id-headers``)
echoes it. llama.cpp's server, SGLang and Ollama echo nothing.

So the upstream's ``keepalive`` setting is one of :data:`MODES`:

* ``never``: every request on a fresh connection with ``Connection: close``. A connection
  carries one request, so whatever arrives on it answers that request or nobody.
* ``always``: connections are reused (the operator vouches for the upstream); replies are
  still checked (an echo that names another request, bytes on an idle connection).
* ``auto`` (the default, and what ``true`` means): connection-per-request until the upstream
  has *proved* it echoes, then keep-alive with every reply required to carry its request's id.

``auto``'s states and what moves them (``TRANSITIONS``, consulted by :meth:`Reuse.observe`):

    state     event      next      effect
    PROBING   ECHO       PROBING   streak + 1; TRUSTED once the streak reaches ``proof``
    PROBING   NO_ECHO    PROBING   streak 0
    PROBING   ANOMALY    PROBING   streak 0, proof doubled (at most MAX_PROOF)
    TRUSTED   ECHO       TRUSTED
    TRUSTED   NO_ECHO    PROBING   streak 0 (the upstream stopped echoing: a restart?)
    TRUSTED   ANOMALY    PROBING   streak 0, proof doubled

``ECHO``: a reply's head carried the request's own id; ``NO_ECHO``: it carried none;
``ANOMALY``: any framing anomaly on any connection to the upstream (a wrong id, a missing
one where it was required, bytes after a reply or on an idle connection). A reply that
breaks the rule on a trusted connection is refused, never delivered: the connection was
closed with it (gateway/upstream/connection.py).
"""

from __future__ import annotations

import enum

MODES = ("auto", "always", "never")
PROOF = 8  # echoed replies in a row before auto turns keep-alive on
MAX_PROOF = 1024


class ReuseState(enum.Enum):
    PROBING = "probing"  # a connection per request; counting echoes
    TRUSTED = "trusted"  # keep-alive; every reply must echo its request's id


class Event(enum.Enum):
    ECHO = "echo"
    NO_ECHO = "no_echo"
    ANOMALY = "anomaly"


# (state, event) -> (next state, what happens to the streak): "+1", "0"; "0*" doubles proof
TRANSITIONS: dict[tuple[ReuseState, Event], tuple[ReuseState, str]] = {
    (ReuseState.PROBING, Event.ECHO): (ReuseState.PROBING, "+1"),
    (ReuseState.PROBING, Event.NO_ECHO): (ReuseState.PROBING, "0"),
    (ReuseState.PROBING, Event.ANOMALY): (ReuseState.PROBING, "0*"),
    (ReuseState.TRUSTED, Event.ECHO): (ReuseState.TRUSTED, "+1"),
    (ReuseState.TRUSTED, Event.NO_ECHO): (ReuseState.PROBING, "0"),
    (ReuseState.TRUSTED, Event.ANOMALY): (ReuseState.PROBING, "0*"),
}


_ECHO = Event.ECHO
_TRUSTED = ReuseState.TRUSTED


class Reuse:
    """One upstream's keep-alive decision (``mode`` one of :data:`MODES`)."""

    __slots__ = ("_state", "keepalive", "mode", "must_echo", "proof", "streak")

    def __init__(self, mode: str = "auto", *, proof: int | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"keepalive mode must be one of {', '.join(MODES)}")
        self.mode = mode
        # Must a reply on a reused connection carry its request's id (auto, trusted)?
        self.must_echo = mode == "auto"
        self.proof = PROOF if proof is None else proof
        self.streak = 0
        self.state = ReuseState.TRUSTED if mode == "always" else ReuseState.PROBING

    def __repr__(self) -> str:
        return f"<Reuse {self.mode} {self.state.value} {self.streak}/{self.proof}>"

    @property
    def state(self) -> ReuseState:
        return self._state

    @state.setter
    def state(self, state: ReuseState) -> None:
        self._state = state
        # May a request now go out on a reused (or reusable) connection? (read per request)
        self.keepalive = self.mode != "never" and state is _TRUSTED

    def observe(self, event: Event) -> bool:
        """Feed one event; True when keep-alive was turned on or off by it."""
        if self.mode != "auto":
            return False
        before = self._state
        if event is _ECHO and before is _TRUSTED:  # the steady state: no table (Enum hashes)
            self.streak += 1
            return False
        state, streak = TRANSITIONS[(before, event)]
        if streak == "+1":
            self.streak += 1
            if state is ReuseState.PROBING and self.streak >= self.proof:
                state = ReuseState.TRUSTED
        else:
            self.streak = 0
            if streak == "0*":
                self.proof = min(self.proof * 2, MAX_PROOF)
        self.state = state
        return state is not before
