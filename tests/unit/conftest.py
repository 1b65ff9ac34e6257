"""Fixtures shared by the unit tier."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.unit.node_rig import NodeRig


@pytest.fixture
async def rig() -> AsyncIterator[NodeRig]:
    """A node rig with the default settings, its nodes stopped after the test (a test file
    that needs other settings declares its own `rig`)."""
    async with NodeRig() as rig:
        yield rig
