"""One identity and permission model for every protocol (docs/security.md).

- :mod:`.rights`: grants as NATS-syntax address patterns, coverage of subscription patterns;
  :class:`Principal` and :class:`Rights`.
- :mod:`.users`: the TOML users file (``--users FILE``).
- :mod:`.passwords`: scrypt password hashes (``mqhub users hash``).
- :mod:`.session`: one connection's principal and its cached decisions.
- :mod:`.directory`: the hub's :class:`Directory` (``hub.identity``): credentials to
  principals, reloads, denial counters and log, failed-login slowdown.
- :mod:`.guarded`: the rights enforced at the core seam (``core.session(session)``).
"""

from mqhub.identity.directory import Directory, LoginThrottle
from mqhub.identity.guarded import GuardedCore
from mqhub.identity.rights import ALL_RIGHTS, EVERYTHING, NOTHING, Grants, Principal, Rights
from mqhub.identity.session import ADMIN, LOGIN, PUBLISH, SUBSCRIBE, Session
from mqhub.identity.users import UsersFile, UsersFileError

__all__ = ["ADMIN", "ALL_RIGHTS", "EVERYTHING", "NOTHING", "Directory", "Grants", "GuardedCore", "LOGIN", "LoginThrottle", "PUBLISH",
           "Principal", "Rights", "SUBSCRIBE", "Session", "UsersFile", "UsersFileError"]
