"""Tools for measuring and testing a deployment on real servers: run a node process, read what
the nodes publish (read_committed) and tally lateness. Used by the integration tests, the
benchmark, the locust scenarios and `chronowheel demo`.

- `NodeProcess`: `chronowheel node` as a child process (metrics port from its log, /healthz,
  /metrics, graceful stop); `wait_owned` for a node run in this process;
- `Collector` / `collecting`: a background read_committed reader of whole topics, each message a
  `Fired` stamped with its arrival time; `committed_past`: the barrier "every shard's committed
  watermark is past T" (with `Collector.read_to_end`, what "nothing more arrives" waits for);
- `LatenessTally`: lateness percentiles by group, early, duplicate and missing occurrences;
- `require_loopback`: refuse servers that are not on this machine (`non_loopback_hosts`: which
  are not, for a tool that may load another cluster when told to); `drop_namespace` (and
  `drop_namespace_quietly` for synchronous teardown): delete a scratch namespace's topics and
  keyspace.
"""

from chronowheel.testing.collect import Collector, Fired, collecting, committed_past, wall_ms
from chronowheel.testing.lateness import GroupTally, LatenessTally, percentile, summarize
from chronowheel.testing.local import (
    drop_namespace,
    drop_namespace_quietly,
    non_loopback_hosts,
    require_loopback,
)
from chronowheel.testing.node_process import (
    NodeProcess,
    NodeProcessError,
    metric_sum,
    parse_metrics,
    wait_owned,
)

__all__ = [
    "Collector",
    "Fired",
    "GroupTally",
    "LatenessTally",
    "NodeProcess",
    "NodeProcessError",
    "collecting",
    "committed_past",
    "drop_namespace",
    "drop_namespace_quietly",
    "metric_sum",
    "non_loopback_hosts",
    "parse_metrics",
    "percentile",
    "require_loopback",
    "summarize",
    "wait_owned",
    "wall_ms",
]
