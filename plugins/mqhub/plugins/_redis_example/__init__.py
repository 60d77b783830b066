"""The Redis RESP example protocol's implementation (codec and Twisted server), loaded lazily."""
