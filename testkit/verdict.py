"""What a fault run found, and the one check every fault test ends with: `assert_clean`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class HasTails(Protocol):
    def tails(self, chars: int = ...) -> str: ...


@dataclass(kw_only=True)
class Verdict:
    """Occurrences lost (accepted but never delivered), delivered early and delivered twice, as
    a read_committed reader saw them. Subclasses add what else makes a run unclean."""

    lost: int = 0
    early: int = 0
    duplicates: int = 0
    lost_examples: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        """What is wrong, one sentence each; empty when the run is clean."""
        out = []
        if self.lost:
            examples = f", e.g. {self.lost_examples[:5]}" if self.lost_examples else ""
            out.append(f"{self.lost} accepted occurrences never arrived{examples}")
        if self.early:
            out.append(f"{self.early} deliveries before their scheduled instant")
        if self.duplicates:
            out.append(f"{self.duplicates} duplicate deliveries to a read_committed reader")
        return out

    def summary(self) -> str:
        return f"lost {self.lost}, early {self.early}, duplicates {self.duplicates}"


def assert_clean(verdict: Verdict, nodes: HasTails | None = None) -> None:
    """0 lost, 0 early, 0 duplicate and whatever else the verdict counts as a problem; the
    failure names every problem, the run's summary and the nodes' log tails."""
    problems = verdict.problems()
    tails = nodes.tails() if nodes is not None else ""
    assert not problems, "; ".join(problems) + f"\n{verdict.summary()}{tails}"
