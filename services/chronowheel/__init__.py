"""chronowheel: a durable scheduler for future work (Cassandra buckets, timing wheels, Kafka)."""

__version__ = "0.1.0"
