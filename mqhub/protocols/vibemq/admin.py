"""The VibeMQ admin user commands (50–56) over a :class:`UserStore`. No Twisted import."""

from __future__ import annotations

import json
from typing import Any

from mqhub.protocols.vibemq import codec as c
from mqhub.protocols.vibemq.auth import UsersError, UserStore


def _field(data: dict[str, Any], key: str) -> str:
    """A required non-empty string field."""
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise UsersError("INVALID_PAYLOAD", f"'{key}' is required.")
    return value


def handle_admin(users: UserStore, actor: str, type_: int,
                 payload: bytes | None) -> bytes | None | tuple[str, str]:
    """Run one admin command; return the reply payload, or ``(code, message)`` on error."""
    try:
        data = json.loads(payload) if payload is not None else {}
    except ValueError:
        return ("INVALID_PAYLOAD", "Payload is not valid JSON.")
    if not isinstance(data, dict):
        return ("INVALID_PAYLOAD", "Payload must be a JSON object.")
    try:
        if type_ == c.ADMIN_LIST_USERS:
            return json.dumps([{"username": u.username, "isSuperuser": u.superuser}
                               for u in users.users.values()]).encode()
        name = _field(data, "username")
        if type_ == c.ADMIN_CREATE_USER:
            users.create(name, _field(data, "password"))
        elif type_ == c.ADMIN_DELETE_USER:
            users.delete(name, actor)
        elif type_ == c.ADMIN_CHANGE_PASSWORD:
            users.change_password(name, _field(data, "newPassword"))
        elif type_ == c.ADMIN_GRANT_PERMISSION:
            ops = data.get("operations")
            if not isinstance(ops, list):
                raise UsersError("INVALID_PAYLOAD", "'operations' must be a list.")
            users.grant(name, _field(data, "queuePattern"), ops)
        elif type_ == c.ADMIN_REVOKE_PERMISSION:
            users.revoke(name, _field(data, "queuePattern"))
        elif type_ == c.ADMIN_GET_USER_PERMISSIONS:
            user = users.users.get(name)
            if user is None:
                raise UsersError("USER_NOT_FOUND", f"User '{name}' not found.")
            return json.dumps([{"queuePattern": p, "operations": sorted(ops)}
                               for p, ops in user.permissions.items()]).encode()
    except UsersError as exc:
        if len(exc.args) == 2:
            return (exc.args[0], exc.args[1])
        return ("INVALID_PAYLOAD", str(exc))
    return None
