"""The read model of a running namespace, for the operators' tools: the shard count, the shard
owners (the `<ns>-nodes` consumer group), each shard's state record, a shard's status, the
decoding of a topic's messages, and the formatting of instants, durations and tables.

The CLI (`cli/`) and the console (`console/`) show what this package reads; the client reads
jobs through its store. Nothing here parses arguments or prints.
"""
