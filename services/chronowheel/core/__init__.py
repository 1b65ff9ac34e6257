"""Pure scheduling logic. Nothing in this package imports a database or Kafka driver."""
