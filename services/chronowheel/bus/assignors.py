"""How the node group shares the shards: the sticky assignor first, round robin second.

Ownership of shard k is the group assignment of partition k of `<ns>.submit`. aiokafka's
default, round robin, deals the partitions out again from scratch at every rebalance: with two
nodes and eight shards, a third node joining moved four shards, two of them from one old node
to the other. A shard that moves is taken over in full (docs/design.md, "Takeover"), one that
stays is resumed warm ("Warm shards"), so every needless move costs a reload. The sticky
assignor (KIP-54, shipped with aiokafka) keeps the assignment as balanced as round robin (the
counts differ by at most one) and otherwise leaves each partition with the member that held it:
a join moves only the shards the new node takes, a leave only the shards of the node that left.

Both are offered, sticky first: the group uses the first protocol every member offers, so
while nodes of an earlier version (round robin only) are members, the group keeps round robin,
and it turns sticky once they are gone.

aiokafka's sticky assignor keeps the member's last assignment in class attributes. Two group
members in one process (tests, an embedded node) would share them and claim each other's
partitions, so each consumer gets a class of its own. aiokafka does not hand the group's
generation to the assignor: every member reports generation -1, and a partition claimed by two
members (a member whose session expired claims what it held) goes to one of them, which is a
valid assignment either way (one owner per partition; the takeover fences whoever held it).
"""

from __future__ import annotations

from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor


def node_assignors() -> tuple[type[AbstractPartitionAssignor], ...]:
    """The assignors of one node's group consumer, in order of preference (a new sticky class
    per call: see the module's text)."""
    own: type[StickyPartitionAssignor] = type(
        "NodeStickyAssignor", (StickyPartitionAssignor,),
        {"member_assignment": None,
         "generation": StickyPartitionAssignor.DEFAULT_GENERATION_ID,
         "_latest_partition_movements": None})
    return own, RoundRobinPartitionAssignor
