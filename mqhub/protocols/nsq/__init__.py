"""NSQ: nsqd-compatible TCP protocol V2 and HTTP API."""
