"""mqhub: one Twisted broker for NSQ, NATS/mq9, eMQP, MQKS and VibeMQ over one durable store."""

__version__ = "0.1.0"
