"""The browser-test harness itself (browser_support.py): a real headless Chromium loads a
small page from a real HTTP server on localhost, a click runs the page's script, the phone
viewport is what CSS sees, and a test's cookies and storage do not reach the next test."""

import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from browser_support import (browser, console_errors, desktop_size, phone_size, reset_browser,  # noqa: F401
                             screenshot, wait_for_element, wait_for_text)
from conftest import free_port

PAGE = b"""<!doctype html>
<html><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>harness</title>
<style>
  #narrow { display: none }
  @media (max-width: 600px) { #narrow { display: block } #wide { display: none } }
</style></head>
<body>
  <h1 id="status">waiting</h1>
  <button id="go" onclick="later()">Go</button>
  <p id="wide">wide layout</p><p id="narrow">narrow layout</p>
  <script>
    let n = 0;
    // After a delay, so that the test has to wait for it.
    function later() { setTimeout(() => { document.getElementById("status").textContent = "clicked " + (++n) }, 100) }
    console.error("harness page loaded");
  </script>
</body></html>"""


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path != "/":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args):
        pass


@pytest.fixture
def page_url():
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def _viewport(driver):
    return driver.execute_script("return [window.innerWidth, window.innerHeight]")


def test_click_runs_the_page_script(browser, page_url):
    browser.get(page_url)
    assert browser.title == "harness"
    assert wait_for_element(browser, "#status").text == "waiting"
    wait_for_element(browser, "button#go").click()
    wait_for_text(browser, "#status", "clicked 1", timeout=5)
    wait_for_element(browser, "#go").click()
    assert wait_for_text(browser, "h1", "clicked 2", timeout=5).get_attribute("id") == "status"
    # The desktop viewport is exact, and the page's console is read.
    assert _viewport(browser) == [1280, 900]
    assert wait_for_element(browser, "#wide").text == "wide layout"
    assert any("harness page loaded" in m for m in console_errors(browser))


def test_phone_size_is_what_css_sees(browser, page_url, tmp_path):
    browser.get(page_url)
    phone_size(browser)
    assert _viewport(browser) == [390, 844]
    assert wait_for_element(browser, "#narrow").text == "narrow layout"
    assert not browser.find_element("css selector", "#wide").is_displayed()
    wait_for_element(browser, "#go").click()  # a tap still clicks
    wait_for_text(browser, "#status", "clicked 1", timeout=5)
    shot = screenshot(browser, tmp_path / "phone.png")
    assert struct.unpack(">II", shot.read_bytes()[16:24]) == (390, 844)  # the PNG's IHDR
    desktop_size(browser)
    assert _viewport(browser) == [1280, 900]
    assert wait_for_element(browser, "#wide").is_displayed()


def test_reset_clears_cookies_and_storage(browser, page_url):
    browser.get(page_url)
    browser.add_cookie({"name": "session", "value": "1"})
    browser.execute_script("localStorage.setItem('k', 'v')")
    phone_size(browser)
    reset_browser(browser)
    assert browser.current_url == "about:blank"
    assert _viewport(browser) == [1280, 900]
    browser.get(page_url)
    assert browser.get_cookies() == []
    assert browser.execute_script("return localStorage.getItem('k')") is None


def test_wait_for_text_fails_with_what_the_page_had(browser, page_url):
    browser.get(page_url)
    with pytest.raises(pytest.fail.Exception, match=r"1 element\(s\) match '#status', their texts: \['waiting'\]"):
        wait_for_text(browser, "#status", "never", timeout=0.3)
