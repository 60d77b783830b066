"""/stats in nsqd's JSON shape (and its text report), built from the topic registry and clients."""

from __future__ import annotations

from typing import Any

_EMPTY_LATENCY = {"count": 0, "percentiles": None}


def client_stats(proto: Any) -> dict[str, Any]:
    """One CLIENT record (nsqd's field names) for a connection."""
    ident = proto.identity
    peer = proto._peer()
    record: dict[str, Any] = {
        "client_id": ident.client_id,
        "hostname": ident.hostname,
        "version": "V2",
        "remote_address": peer,
        "state": {"init": 1, "subscribed": 3, "closing": 4}.get(proto.state, 1),
        "ready_count": proto.ready_count,
        "in_flight_count": proto.consumer.in_flight if proto.consumer is not None else 0,
        "message_count": proto.message_count,
        "finish_count": proto.finish_count,
        "requeue_count": proto.requeue_count,
        "connect_ts": proto.connect_ts,
        "sample_rate": ident.sample_rate,
        "deflate": ident.deflate,
        "snappy": ident.snappy,
        "user_agent": ident.user_agent,
        "tls": proto.tls,
        "tls_cipher_suite": "",
        "tls_version": "",
        "tls_negotiated_protocol": "",
        "tls_negotiated_protocol_is_mutual": False,
    }
    if proto.auth is not None:
        record.update(authed=True, auth_identity=proto.auth.identity,
                      auth_identity_url=proto.auth.identity_url)
    return record


def build_stats(service: Any, topic: str | None = None, channel: str | None = None,
                include_clients: bool = True) -> dict[str, Any]:
    """nsqd's ``/stats?format=json`` document, optionally filtered to one topic/channel."""
    registry = service.registry
    clients = list(service.factory.clients)
    consumers: dict[tuple[str, str], list[Any]] = {}
    producers: list[dict[str, Any]] = []
    for proto in clients:
        if proto.consumer is not None:
            consumers.setdefault((proto.topic_name, proto.channel_name), []).append(proto)
        elif include_clients:
            record = client_stats(proto)
            record["pub_counts"] = [{"topic": t, "count": n} for t, n in sorted(proto.pub_counts.items())]
            producers.append(record)
    topics = []
    for name in sorted(registry.topics):
        if topic is not None and name != topic:
            continue
        t = registry.topics[name]
        chans = []
        for cname in sorted(t.channels):
            if channel is not None and cname != channel:
                continue
            queue = t.channels[cname]
            members = consumers.get((name, cname), [])
            chans.append({
                "channel_name": cname,
                "depth": queue.depth,
                "backend_depth": 0 if queue.tier == "memory" else queue.depth,
                "in_flight_count": queue.in_flight,
                "deferred_count": queue.deferred,
                "message_count": queue.message_count,
                "requeue_count": queue.requeue_count,
                "timeout_count": queue.timeout_count,
                "client_count": len(members),
                "clients": [client_stats(p) for p in members] if include_clients else [],
                "paused": queue.paused,
                "e2e_processing_latency": dict(_EMPTY_LATENCY),
            })
        depth = registry.topic_depth(t)
        topics.append({
            "topic_name": name,
            "channels": chans,
            "depth": depth,
            "backend_depth": 0 if t.ephemeral else depth,
            "message_count": t.message_count,
            "message_bytes": t.message_bytes,
            "paused": t.paused,
            "e2e_processing_latency": dict(_EMPTY_LATENCY),
        })
    return {
        "version": service.config.version,
        "health": "OK",
        "start_time": service.start_time,
        "topics": topics,
        "memory": {"heap_objects": 0, "heap_idle_bytes": 0, "heap_in_use_bytes": 0,
                   "heap_released_bytes": 0, "gc_pause_usec_100": 0, "gc_pause_usec_99": 0,
                   "gc_pause_usec_95": 0, "next_gc_bytes": 0, "gc_total_runs": 0},
        "producers": producers or None,
    }


def render_text_stats(data: dict[str, Any]) -> str:
    """The human-readable /stats report (nsqd's text layout, abridged)."""
    lines = [f"nsqd v{data['version']} (mqhub)", f"start_time {data['start_time']}",
             f"\nHealth: {data['health']}\n"]
    if not data["topics"]:
        lines.append("\nTopics: None\n")
    else:
        lines.append("\nTopics:")
    for t in data["topics"]:
        state = " [paused]" if t["paused"] else ""
        lines.append(f"   [{t['topic_name']:<24}] depth: {t['depth']:<5} be-depth: "
                     f"{t['backend_depth']:<5} msgs: {t['message_count']:<8}{state}")
        for c in t["channels"]:
            cstate = " [paused]" if c["paused"] else ""
            lines.append(
                f"      [{c['channel_name']:<22}] depth: {c['depth']:<5} be-depth: {c['backend_depth']:<5} "
                f"inflt: {c['in_flight_count']:<4} def: {c['deferred_count']:<4} re-q: {c['requeue_count']:<5} "
                f"timeout: {c['timeout_count']:<5} msgs: {c['message_count']:<8}{cstate}")
            for cl in c["clients"]:
                lines.append(
                    f"        [V2 {cl['client_id']:<20}] state: {cl['state']} inflt: {cl['in_flight_count']:<4} "
                    f"rdy: {cl['ready_count']:<4} fin: {cl['finish_count']:<8} re-q: {cl['requeue_count']:<8} "
                    f"msgs: {cl['message_count']:<8} connected: {cl['connect_ts']}")
    producers = data["producers"] or []
    lines.append("\nProducers:" if producers else "\nProducers: None")
    for p in producers:
        lines.append(f"   [V2 {p['client_id']:<20}] msgs: "
                     f"{sum(c['count'] for c in p['pub_counts']):<8} connected: {p['connect_ts']}")
    return "\n".join(lines) + "\n"
