"""Kafka access: the only package that imports aiokafka.

`ports.py` names what the node needs from Kafka; `kafka_node.py` implements it over aiokafka and
`memory.py` in memory (tests); `kafka.py` holds topic administration and client factories.
"""
