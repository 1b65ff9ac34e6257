"""Client helpers that write the v1 wire format to `<ns>.submit`."""
