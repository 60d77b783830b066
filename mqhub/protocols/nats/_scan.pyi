"""Types of the optional C loop of the NATS frame scanner (_scan.c)."""

def scan_run(buf: bytes, pos: int, table: dict[bytes, bytes],
             max_payload: int) -> tuple[bytes, int, int, int]: ...
