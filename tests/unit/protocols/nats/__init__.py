"""NATS and mq9 protocol tests (codec, server, mq9, core bridge, plugin service)."""
