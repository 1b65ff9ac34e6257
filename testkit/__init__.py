"""The fault harness of a source checkout: what only the tests and the load tools need, kept
out of the `chronowheel` package (an installed wheel has no local stack to drive).

- `fleet`: node processes of one run (start, kill, pause, owned shards, log tails), the one
  bounded poller `until`;
- `verdict`: what a run found (lost, early, duplicate occurrences) and the one `assert_clean`;
- `faults`: faults of a node (a cut-off through proxies and a network namespace, a stepped
  clock, a held event loop, a full disk as the store and the bus report it), a run of jobs
  and its `Outcome`, the takeover phases a node logs;
- `chaos`: scenarios on the local stack's cluster profile and their `ScenarioResult`;
- `cluster`: `LocalCluster`, the cluster profile of deploy/local/stack.py;
- `locust`: a locust file of loadtest/ run headless (`run_locust`), as the tests of the load
  kits run it;
- `containers`: CHRONOWHEEL_SERVERS=containers, the servers in containers (testcontainers)
  with the local stack's versions and settings (a pytest plugin).

Importable where the checkout's root is on the path: pytest (`pythonpath` in pyproject.toml)
and the scripts under loadtest/. What users' tests may use ships in `chronowheel.testing`.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
"""The root of the checkout."""
STACK_SCRIPT = REPO / "deploy" / "local" / "stack.py"
"""The local stack (`./run stack`)."""
