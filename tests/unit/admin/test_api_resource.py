"""The admin API resource rendered in process (DummyRequest, memory hub, no network)."""

from __future__ import annotations

import io
import json
from typing import Any

from twisted.web.server import NOT_DONE_YET
from twisted.web.test.requesthelper import DummyRequest

from mqhub.introspect import Inspector
from mqhub.manhole import namespace
from mqhub.testing import CollectingTarget, memory_hub, result_of, settle
from mqhub.web.api import ApiResource


def request(resource: ApiResource, hub: Any, method: str, path: str, body: Any = None,
            headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, decoded JSON) of one request; the hub's clock is settled so commits land."""
    req = DummyRequest([])
    req.method = method.encode()
    raw_path, _, query = path.partition("?")
    req.path = raw_path.encode()
    for pair in filter(None, query.split("&")):
        key, _, value = pair.partition("=")
        req.addArg(key.encode(), value.encode())
    req.content = io.BytesIO(b"" if body is None else json.dumps(body).encode())
    for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
        req.requestHeaders.setRawHeaders(name, [value])
    finished = req.notifyFinish()
    result = resource.render(req)
    if result is not NOT_DONE_YET:
        req.write(result)
        req.finish()
    settle(hub, 4)
    result_of(finished)
    return req.responseCode or 200, json.loads(b"".join(req.written))


def dead_letter_hub() -> tuple[Any, Any]:
    """A memory hub whose queue ``jobs`` holds one dead letter (max_attempts) and one ready."""
    hub = memory_hub()
    broker = hub.broker
    q = broker.declare_queue("jobs", max_attempts=1)
    broker.bind_queue("jobs", "jobs")
    broker.publish_batch("jobs", [b"bad", b"good"], origin="nsq")
    settle(hub)
    target = CollectingTarget(protocol_name="nsq")
    consumer = q.attach(target, ready=1)
    settle(hub)
    consumer.set_ready(0)
    q.requeue(consumer, [target.entries[0][0]])
    q.detach(consumer)
    settle(hub)
    assert q.dead_letter_count == 1 and q.depth == 1
    return hub, q


def test_dlq_listing_and_replay_by_id() -> None:
    """GET /api/dlq and /api/dlq/jobs, then POST replay of the listed id."""
    hub, q = dead_letter_hub()
    api = ApiResource(Inspector(hub))
    status, listing = request(api, hub, "GET", "/api/dlq")
    assert status == 200 and listing["queues"][0]["reasons"] == {"max_attempts": 1}
    status, letters = request(api, hub, "GET", "/api/dlq/jobs?limit=10")
    (letter,) = letters["dead_letters"]
    assert (letter["reason"], letter["preview"], letter["origin"]) == ("max_attempts", "bad", "nsq")
    status, answer = request(api, hub, "POST", "/api/dlq/jobs/replay", {"ids": [letter["id"]]})
    assert (status, answer) == (200, {"queue": "jobs", "replayed": 1})
    assert q.dead_letter_count == 0 and q.depth == 2


def test_errors_are_json_with_status_codes() -> None:
    """Unknown queue 404, bad ids 400, wrong method 405, missing token 401, bad type 415."""
    hub, _ = dead_letter_hub()
    api = ApiResource(Inspector(hub), token="tok")
    assert request(api, hub, "GET", "/api/queues/nope")[0] == 404
    assert request(api, hub, "DELETE", "/api/queues/jobs")[0] == 405
    assert request(api, hub, "POST", "/api/dlq/jobs/purge", {})[0] == 401
    auth = {"Authorization": "Bearer tok"}
    status, err = request(api, hub, "POST", "/api/dlq/jobs/replay", {"ids": ["xyz"]}, auth)
    assert status == 400 and "16 hex" in err["error"]
    status, err = request(api, hub, "PATCH", "/api/queues/jobs", {"max_attempts": 2},
                          {**auth, "Content-Type": "text/plain"})
    assert status == 415
    status, answer = request(api, hub, "POST", "/api/dlq/jobs/purge", {}, auth)
    assert (status, answer) == (200, {"queue": "jobs", "purged": 1})


def test_manhole_helpers() -> None:
    """queues(), queue(), dlq() and replay(name, n) over the hub's core."""
    hub, q = dead_letter_hub()
    names = namespace(hub, Inspector(hub))
    assert len(names["queues"]()) == 1 and names["queue"]("jobs") is q
    letters = result_of(names["dlq"]("jobs"))
    assert [d.body for d in letters] == [b"bad"]
    replayed = names["replay"]("jobs", 5)
    settle(hub, 4)
    assert result_of(replayed) == 1
    assert q.dead_letter_count == 0 and names["stats"]()["dead_letters"] == 0
    assert names["connections"]() == []


def test_lameduck_endpoint() -> None:
    """GET/POST /api/lameduck: 501 without a controller, 400 on bad timing, 202 when started
    with the body's timing."""
    from twisted.application.service import MultiService

    from mqhub.lameduck import LameDuck

    hub = memory_hub()
    assert request(ApiResource(Inspector(hub)), hub, "GET", "/api/lameduck")[0] == 501
    root = MultiService()
    stopped: list[bool] = []
    root.lame_duck = LameDuck(root, hub.clock, lambda: stopped.append(True))  # type: ignore[attr-defined]
    api = ApiResource(Inspector(hub, root))
    status, answer = request(api, hub, "GET", "/api/lameduck")
    assert (status, answer["lame_duck"], answer["duration"]) == (200, False, 120.0)
    for bad in ({"duration": -1}, {"grace": "soon"}, {"duration": True}, [1]):
        assert request(api, hub, "POST", "/api/lameduck", bad)[0] == 400
    status, answer = request(api, hub, "POST", "/api/lameduck", {"duration": 2, "grace": 1})
    assert (status, answer["lame_duck"], answer["duration"], answer["grace"]) == (202, True, 2, 1)
    assert answer["connections"] == 0 and not stopped
    hub.clock.advance(1)
    hub.clock.advance(1)
    assert stopped == [True]
