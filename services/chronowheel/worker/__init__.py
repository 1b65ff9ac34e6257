"""Worker library: consume fired occurrences, deduplicate, retry, dead-letter."""
