"""Kafka access: the only package that imports aiokafka."""
