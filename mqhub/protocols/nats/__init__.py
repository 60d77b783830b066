"""NATS client protocol, with mq9 agent-mailbox semantics on $mq9.AI.* subjects."""
