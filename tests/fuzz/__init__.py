"""End-to-end fuzzing of a node against the real Cassandra and Kafka (marker `fuzz`).

`test_e2e.py` (its `run_fuzz`, which tests/chaos/test_cluster_fuzz.py runs on the cluster
profile too) starts a namespace of two shards and one node as a child process
(`chronowheel node`), then sends CHRONOWHEEL_FUZZ_COMMANDS raw records (default
300; 100000 for a results run) with aiokafka straight to `<ns>.submit`: commands at and past
every limit (payloads near and over `max_payload_bytes` and over Cassandra's 50 KiB batch
limit, JSON nested 60..2000 deep, ids and headers at their byte limits or with NUL, CR/LF and
U+202E, far past and future instants, crons whose next run is decades away, `every: 1ms`,
`* * * * * *`, 1,000 excluded dates, 10,000-date calendars, duplicate JSON keys, invalid
UTF-8, gzip and zstd batches that expand past the limits (zstd through Kafka's Java client,
`ZstdProduce.java`, where a JVM and the local stack's classpath are found; CHRONOWHEEL_FUZZ_ZSTD=0
sends those as gzip), wrong keys and partitions), mixed with good
one-shots due a few seconds ahead on the same shards. `commands.py` builds them from
`random.Random(CHRONOWHEEL_FUZZ_SEED)` (default: a fresh seed, printed) and the schema's own
limits. After the run it checks: the node is still running; every good job fired exactly once,
at its instant and never early (read_committed reader, `chronowheel.testing.LatenessTally`);
every other command is either applied (its job or calendar row exists) or on `<ns>.rejected`
with a `cw-reason`, matched by `cw-source-partition`/`cw-source-offset` (or, for a command
forwarded from a wrong partition, by key and value digest); nothing is logged at ERROR unless
an error counter of /metrics rose with it. A failure names each command by seed, index, kind,
partition, offset and its first bytes, and says what was expected and what happened; the run's
summary (outcomes by kind, reasons, lateness) is printed and written to
CHRONOWHEEL_FUZZ_REPORT when set. Re-run one seed with CHRONOWHEEL_FUZZ_SEED=<seed>; print one
command with `python -m tests.fuzz.commands <seed> <index>`.
"""
