"""The ``process_*`` figures of a ``--workers`` worker, as multiprocess metrics.

A process collector would describe only the worker that happens to answer the scrape (CPU
seconds jumping between workers, which Prometheus reads as counter resets), so each worker
writes its own figures instead: the same ``process_*`` names, CPU as one counter summed over
every worker that ran, the gauges one series per live worker with a ``pid`` label.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector


class WorkerProcess:
    """A ``--workers`` worker's process figures, as multiprocess metrics.

    :meth:`sample` runs on the app's 0.5 s probe timer and copies what prometheus-client's
    own ``ProcessCollector`` reads from ``/proc/self`` into metrics that every worker's
    ``/metrics`` serves alike: ``process_cpu_seconds_total`` is a counter, increased by the
    CPU time used since the last sample and summed over every worker that ever ran (a
    replaced worker's seconds stay counted, so the sum never goes down); the gauges are
    ``liveall``, one series per live worker labelled ``pid``. The supervisor's own few
    milliseconds of CPU are not counted.
    """

    _GAUGES = (
        ("process_resident_memory_bytes", "Resident memory size in bytes, per worker"),
        ("process_virtual_memory_bytes", "Virtual memory size in bytes, per worker"),
        ("process_open_fds", "Number of open file descriptors, per worker"),
        ("process_max_fds", "Maximum number of open file descriptors, per worker"),
        (
            "process_start_time_seconds",
            "Start time of the worker since unix epoch in seconds, per worker",
        ),
    )

    def __init__(self, registry: CollectorRegistry) -> None:
        self._collector = ProcessCollector(registry=None)
        self._cpu_seen = 0.0
        self.cpu = Counter(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds, all workers",
            registry=registry,
        )
        self.gauges = {
            name: Gauge(name, doc, registry=registry, multiprocess_mode="liveall")
            for name, doc in self._GAUGES
        }
        self.sample()

    def sample(self) -> None:
        for family in self._collector.collect():  # nothing where /proc is missing
            for sample in family.samples:
                if sample.name == "process_cpu_seconds_total":
                    if sample.value > self._cpu_seen:
                        self.cpu.inc(sample.value - self._cpu_seen)
                        self._cpu_seen = sample.value
                elif (gauge := self.gauges.get(sample.name)) is not None:
                    gauge.set(sample.value)
