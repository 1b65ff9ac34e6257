"""How many examples a property test (`@given`) runs.

By default, the count the test states: plain pytest, `./run unit`, `./run test` and CI run it
in full. `CHRONOWHEEL_HYPOTHESIS=quick` (for an edit-and-run loop: `CHRONOWHEEL_HYPOTHESIS=quick
./run unit`, about 18% less CPU for the tier here) runs a third of it (at least 25): these tests
draw fresh random examples on every run and Hypothesis replays the examples that failed before
first (its database, `.hypothesis/`), so three quick runs try about as many examples as one
full run. Under CI (`CI` set) it is ignored. The state machines (`RuleBasedStateMachine`: the
wheel's, the shard's) do not use this: they run their full count everywhere.
"""

from __future__ import annotations

import os

QUICK_SHARE = 3
QUICK_MIN = 25


def quick() -> bool:
    """Whether this run is the quick loop (never under CI)."""
    return (os.environ.get("CHRONOWHEEL_HYPOTHESIS", "").strip() == "quick"
            and not os.environ.get("CI", "").strip())


def examples(stated: int) -> int:
    """`max_examples` for a property test that states `stated`."""
    return max(QUICK_MIN, stated // QUICK_SHARE) if quick() else stated
