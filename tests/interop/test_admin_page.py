"""The admin page end to end in Debian's headless Chromium (Selenium + chromedriver).

NSQ creates a queue, the page shows its depth; max_attempts is set through the API; a raw NSQ
consumer's REQ dead-letters the message; the page's Replay button puts it back and the depth
cell changes. A NATS connection shows in the protocols' counters column. A screenshot is saved (docs/operations.md shows the copy in docs/images/).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from mqhub.protocols.nsq import codec as wire
from tests.interop.admin_client import admin_url, call, get, queue_row, wait_for
from tests.interop.nsq_client import NsqSocket, ok
from tests.interop.test_admin_protocol_counters import nats_client

pytestmark = pytest.mark.interop

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
QUEUE = "nsq/orders/archive"
SCREENSHOT_COPY = Path(__file__).resolve().parents[2] / "docs" / "images" / "admin-page.png"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1280,1200")


@pytest.fixture
def browser(tmp_path: Path) -> Any:
    """A headless Chromium session with a fresh profile, closed after the test."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.fail("chromium/chromedriver missing: `make test` installs them (make browser)")
    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager fetch drivers
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def text(driver: Any, selector: str) -> str:
    """Text of the first element matching ``selector`` ('' when none); read in one step, as
    the page re-renders its rows on every poll."""
    return str(driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : '';",
        selector))


def cell(driver: Any, queue: str, field: str) -> str:
    """Text of one queue cell on the page ('' when the row is not shown)."""
    return text(driver, f'tr[data-queue="{queue}"] td[data-field="{field}"]')


def click_row(driver: Any, queue: str) -> bool:
    """Click the queue's row (a poll may replace it under the click: then False, try again)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        driver.find_element(By.CSS_SELECTOR, f'tr[data-queue="{queue}"]').click()
    except StaleElementReferenceException:
        return False
    return True


def orders_and_payments(make_broker: Any) -> Any:
    """A broker (NSQ and mq9, no fsync) with topics ``orders`` and ``payments`` and their
    channels ``archive`` and ``ledger``."""
    broker = make_broker(["nsq", "mq9"], extra_args=["--durability", "none"])
    ok(broker, "/topic/create?topic=orders")
    ok(broker, "/channel/create?topic=orders&channel=archive")
    ok(broker, "/topic/create?topic=payments")
    ok(broker, "/channel/create?topic=payments&channel=ledger")
    return broker


def test_page_shows_depth_dead_letter_and_replays_it(make_broker: Any, browser: Any,
                                                     tmp_path: Path) -> None:
    """The Done-when scenario of issue 14, step by step."""
    from selenium.webdriver.common.by import By

    broker = orders_and_payments(make_broker)
    ok(broker, "/mpub?topic=orders", b"order-1\norder-2\norder-3")
    ok(broker, "/pub?topic=payments", b"payment-1")

    browser.get(admin_url(broker) + "/")
    wait_for(lambda: cell(browser, QUEUE, "depth") == "3", "depth 3 on the page")
    counters = 'tr[data-protocol="mq9"] td.counters'
    seen = get(broker, "/api/stats")["protocols"]["mq9"]["total_connections"]  # port probes
    nats = nats_client(broker.port("mq9", "tcp"))  # counted in mq9's total_connections
    wait_for(lambda: text(browser, counters) == f"total_connections {seen + 1}",
             "a protocol counter on the page")
    assert cell(browser, "nsq/payments/ledger", "depth") == "1"
    assert cell(browser, QUEUE, "dead") == "0"

    status, detail = call(broker, "/api/queues/nsq%2Forders%2Farchive", "PATCH", {"max_attempts": 1})
    assert status == 200 and detail["max_attempts"] == 1
    wait_for(lambda: cell(browser, QUEUE, "max_attempts") == "1", "max_attempts on the page")

    consumer = NsqSocket(broker.port("nsq", "tcp"))
    consumer.send(wire.encode_sub("orders", "archive") + wire.encode_rdy(1))
    (msg,) = consumer.messages_until(1, "one order")
    consumer.send(wire.encode_rdy(0) + b"REQ " + msg.msg_id + b" 0\n")
    wait_for(lambda: cell(browser, QUEUE, "dead") == "1", "the dead letter on the page")
    assert cell(browser, QUEUE, "depth") == "2"
    consumer.close()
    nats.close()

    wait_for(lambda: click_row(browser, QUEUE), "a click on the queue row")
    row = wait_for(lambda: text(browser, "#dlq tbody tr"), "the DLQ view")
    assert "max_attempts" in row and "order-1" in row
    before = tmp_path / "admin-page.png"
    assert browser.save_screenshot(str(before))  # the DLQ view, for docs/operations.md
    assert before.stat().st_size > 10_000
    browser.find_element(By.CSS_SELECTOR, 'button[data-action="replay"]').click()
    wait_for(lambda: cell(browser, QUEUE, "depth") == "3", "depth back to 3 after Replay")
    wait_for(lambda: cell(browser, QUEUE, "dead") == "0", "no dead letter after Replay")
    assert queue_row(broker, QUEUE)["depth"] == 3
    assert browser.find_elements(By.CSS_SELECTOR, 'button[data-action="purge"]')

    after = tmp_path / "admin-page-replayed.png"
    assert browser.save_screenshot(str(after))
    if os.environ.get("MQHUB_UPDATE_SCREENSHOT"):
        shutil.copyfile(before, SCREENSHOT_COPY)
