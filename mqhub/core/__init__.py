"""The protocol-neutral broker core: ids, messages, address routing, queues, consumers, dead letters."""
