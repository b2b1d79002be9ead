"""The upstream side: one connection (llhttp in an ``asyncio.Protocol``), the keep-alive
pool, the client (requests, deadlines, caps, one error map) and the one call over it.

    connection.py   one HTTP/1.1 connection: llhttp frames the replies; anomalies
    pool.py         keep-alive connections to one upstream, FIFO slots, idle sweep
    reuse.py        when a connection may carry a second request (keepalive auto/always/never)
    replicas.py     which replica takes a request: rendezvous hashing, bounded load, ejection
    client.py       UpstreamClient / UpstreamResponse: the request path over the replicas:
                    retries before the head, deadlines, caps, the error map
    members.py      the replica set: pools, targets, series, probes, DNS joins and leaves
    discovery.py    replicas from a DNS name (discover = "dns"): resolution, the set's diff
    fleet.py        the background work: re-resolution and active health probes
    call.py         send(): the one upstream call every caller makes, counted
    known.py        every secret the process knows: the redactor error text is scrubbed with
    exceptions.py   the errors below the client, each naming its cause
"""

from gateway.upstream.client import UpstreamClient, UpstreamResponse

__all__ = ["UpstreamClient", "UpstreamResponse"]
