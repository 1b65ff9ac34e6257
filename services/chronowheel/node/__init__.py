"""The scheduler node: shard actors that ingest, load, and dispatch."""
