"""Storage: `base.py` states the contract, `cassandra.py` implements it (the only module that
imports cassandra-driver), `memory.py` in memory for tests."""
