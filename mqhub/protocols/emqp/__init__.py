"""eMQP: the EventMQ protocol over ZeroMQ (router, scheduler and pub/sub)."""
