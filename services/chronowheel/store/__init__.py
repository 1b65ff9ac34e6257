"""Cassandra access: the only package that imports cassandra-driver."""
