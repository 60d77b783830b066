"""Cluster mode: mqhub nodes as protocol gateways over a NATS JetStream cluster (docs/cluster.md)."""
