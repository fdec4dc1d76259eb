"""Browser tests: a real headless Chromium driven through Selenium.

The web console (`sluice serve --console-listen ADDR`) is tested the way a person uses it:
Debian's Chromium (package `chromium`, /usr/bin/chromium) driven by Debian's ChromeDriver
(package `chromium-driver`, /usr/bin/chromedriver) through Selenium (tests/python/requirements.txt).
scripts/test.sh installs both packages when they are missing and it runs as root. Nothing is
downloaded at run time: the driver's path is given to Selenium explicitly, which skips Selenium
Manager (its downloader), and SE_OFFLINE=1 keeps it offline should anything call it anyway.

Use:

    from browser_support import browser, phone_size, wait_for_text  # noqa: F401  (browser is a fixture)

    def test_something(browser, broker_factory):
        browser.get(f"http://127.0.0.1:{port}/")
        wait_for_text(browser, "h1", "Topics")

One browser per test process, a clean state per test: `browser` is function-scoped, but the
Chromium behind it is started once per process (each pytest-xdist worker has its own) and
reset after each test (`reset_browser`): extra windows closed, back on about:blank (which also
ends the page's timers and open connections to a broker that the test stops), cookies and the
HTTP cache cleared, the page's storage cleared, the desktop viewport restored, the console
log drained. Starting and quitting Chromium costs ~1.2 s a test on the 2-core CI machine;
the reset costs tens of milliseconds. What a reset does not clear, the storage of origins the
test left earlier, cannot leak either: storage is per origin (scheme, host, port) and
conftest.free_port never hands out the same port twice in a process, so no two tests see
the same origin (cookies ignore the port, hence they are cleared). A test that wants a
browser of its own (two users at once, say) calls `start_browser()` and quits it itself.

Viewports are exact and independent of the window's chrome: `desktop_size` (1280x900, the
default) and `phone_size` (390x844, mobile, touch) set the page's viewport through the
DevTools protocol (Emulation.setDeviceMetricsOverride), so CSS media queries and
window.innerWidth/innerHeight see exactly those sizes, and screenshots have them.

On a test failure the report gets the page's URL, title, browser console log and source,
and target/browser/failures/ gets a screenshot and the HTML (a pytest hook, registered the
first time the fixture is used). ChromeDriver's and Chromium's own output goes to
target/browser/chromedriver-*.log.
"""

from __future__ import annotations

import atexit
import base64
import os
import re
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from conftest import REPO, free_port

try:
    from selenium import webdriver
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webelement import WebElement
except ImportError as e:  # pragma: no cover
    raise ImportError(f"{e}: browser tests need Selenium: pip install -r tests/python/requirements.txt") from e

# Selenium Manager must never download a driver or a browser (this machine has no internet
# but package registries): the driver's path is always given, and this keeps it offline.
os.environ.setdefault("SE_OFFLINE", "1")

CHROMIUM = os.environ.get("SLUICE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("SLUICE_CHROMEDRIVER", "/usr/bin/chromedriver")
ARTIFACTS = REPO / "target" / "browser"

DESKTOP = (1280, 900)
PHONE = (390, 844)
DEFAULT_TIMEOUT = 10.0
PAGE_LOAD_TIMEOUT = 30.0

CHROMIUM_ARGS = [
    "--headless=new",
    # Chromium's sandbox needs user namespaces or a setuid helper, and refuses to run as
    # root at all: the suite runs as root (CI) in a container.
    "--no-sandbox",
    # Shared memory in /tmp instead of /dev/shm, which is 64 MB in a default Docker container.
    "--disable-dev-shm-usage",
    f"--window-size={DESKTOP[0]},{DESKTOP[1]}",
    "--disable-gpu",
    # No traffic to Google's services: this machine's network is closed (every attempt would
    # be refused, many at a time) and none of it belongs in a test.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-features=Translate,MediaRouter,OptimizationHints",
    "--lang=en-US",
]

MISSING = ("headless browser tests need Chromium at {chromium} and ChromeDriver at {driver}: "
           "install chromium and chromium-driver (Debian): apt-get install chromium chromium-driver")


# ----------------------------------------------------------------------------- starting


def start_browser() -> webdriver.Chrome:
    """A new headless Chromium at the desktop viewport; the caller quits it (`driver.quit()`)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not (os.path.isfile(p) and os.access(p, os.X_OK))]
    if missing:
        pytest.fail(MISSING.format(chromium=CHROMIUM, driver=CHROMEDRIVER) + f" (missing: {', '.join(missing)})",
                    pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in CHROMIUM_ARGS:
        options.add_argument(arg)
    # The page's console (console.log, uncaught errors, failed loads), read by console_log().
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    # ChromeDriver listens on a port of conftest.free_port, not one the kernel hands out
    # (Selenium's default). Its log, at level WARNING (INFO logs every command in full, ~30 KB
    # a test), has Chromium's own stderr too: D-Bus complaints (no system bus here), harmless.
    service = Service(executable_path=CHROMEDRIVER, port=free_port(), service_args=["--log-level=WARNING"],
                      log_output=str(ARTIFACTS / f"chromedriver-{worker}.log"))
    try:
        driver = webdriver.Chrome(service=service, options=options)
    except WebDriverException as e:
        pytest.fail(f"could not start headless Chromium ({CHROMIUM}) through {CHROMEDRIVER}: {e.msg}\n"
                    f"see {ARTIFACTS / f'chromedriver-{worker}.log'}", pytrace=False)
    driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT)
    driver.set_script_timeout(DEFAULT_TIMEOUT)
    desktop_size(driver)
    return driver


_shared: webdriver.Chrome | None = None


def _alive(driver: webdriver.Chrome) -> bool:
    try:
        driver.window_handles
        return True
    except Exception:
        return False


def _shared_browser() -> webdriver.Chrome:
    """This process's browser, started on first use and again if a test quit or crashed it."""
    global _shared
    if _shared is not None and not _alive(_shared):
        _quit(_shared)
        _shared = None
    if _shared is None:
        _shared = start_browser()
    return _shared


def _quit(driver: webdriver.Chrome | None) -> None:
    if driver is None:
        return
    try:
        driver.quit()
    except Exception:
        pass


def _quit_shared() -> None:
    global _shared
    _quit(_shared)
    _shared = None


atexit.register(_quit_shared)


def reset_browser(driver: webdriver.Chrome) -> None:
    """Back to a clean state (see the module's doc): what the fixture does between tests."""
    handles = driver.window_handles
    for handle in handles[1:]:
        driver.switch_to.window(handle)
        driver.close()
    driver.switch_to.window(handles[0])
    origin = _origin(driver.current_url)
    driver.get("about:blank")
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    driver.execute_cdp_cmd("Network.clearBrowserCache", {})
    if origin:
        driver.execute_cdp_cmd("Storage.clearDataForOrigin", {"origin": origin, "storageTypes": "all"})
    desktop_size(driver)
    console_log(driver)  # drained


def _origin(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc}"


# ----------------------------------------------------------------------------- the fixture

_DRIVER_KEY = pytest.StashKey["webdriver.Chrome"]()


@pytest.fixture
def browser(request) -> webdriver.Chrome:
    """A headless Chromium (Selenium WebDriver) on about:blank, desktop viewport, clean state."""
    _register_plugin(request.config)
    driver = _shared_browser()
    request.node.stash[_DRIVER_KEY] = driver
    yield driver
    try:
        reset_browser(driver)
    except Exception:
        # A browser that cannot even be reset is no use to the next test: start another.
        _quit_shared()


class _BrowserPlugin:
    """Adds the browser's state to a failed test's report; quits the browser at the end."""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        driver = item.stash.get(_DRIVER_KEY, None)
        if driver is not None and report.failed and report.when in ("call", "setup"):
            for title, text in _failure_sections(item, driver):
                report.sections.append((title, text))
        return report

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session):
        _quit_shared()


_PLUGIN_NAME = "sluice-browser-support"


def _register_plugin(config) -> None:
    if not config.pluginmanager.has_plugin(_PLUGIN_NAME):
        config.pluginmanager.register(_BrowserPlugin(), _PLUGIN_NAME)


def _failure_sections(item, driver: webdriver.Chrome, max_source: int = 30000) -> list[tuple[str, str]]:
    try:
        url, title = driver.current_url, driver.title
    except Exception as e:
        return [("browser", f"the browser did not answer: {e}")]
    sections = [("browser", f"url: {url}\ntitle: {title}")]
    try:
        lines = [f"{e.get('level')} {e.get('message')}" for e in console_log(driver)]
        sections.append(("browser console log", "\n".join(lines) or "(empty)"))
    except Exception as e:
        sections.append(("browser console log", f"(could not be read: {e})"))
    try:
        source = driver.page_source
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", item.nodeid)[-150:]
        failures = ARTIFACTS / "failures"
        failures.mkdir(parents=True, exist_ok=True)
        (failures / f"{name}.html").write_text(source)
        saved = [str(failures / f"{name}.html")]
        try:
            saved.append(str(screenshot(driver, failures / f"{name}.png")))
        except Exception:
            pass
        more = len(source) - max_source
        cut = f"\n... ({more} more characters in the saved file)" if more > 0 else ""
        sections.append(("browser page source", f"saved: {', '.join(saved)}\n{source[:max_source]}{cut}"))
    except Exception as e:
        sections.append(("browser page source", f"(could not be read: {e})"))
    return sections


# ----------------------------------------------------------------------------- helpers


def set_viewport(driver: webdriver.Chrome, width: int, height: int, mobile: bool = False,
                 scale: float = 1.0) -> None:
    """The page's viewport exactly width x height CSS pixels (at `scale` device pixels each)."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": height, "deviceScaleFactor": scale, "mobile": mobile,
    })
    driver.execute_cdp_cmd("Emulation.setTouchEmulationEnabled",
                           {"enabled": mobile, "maxTouchPoints": 5 if mobile else 1})


def desktop_size(driver: webdriver.Chrome) -> None:
    """A 1280x900 desktop viewport (the default)."""
    set_viewport(driver, *DESKTOP)


def phone_size(driver: webdriver.Chrome, scale: float = 1.0) -> None:
    """A 390x844 phone viewport (an iPhone 12-15's, in CSS pixels), mobile and touch; `scale`
    2 or 3 for sharper screenshots."""
    set_viewport(driver, *PHONE, mobile=True, scale=scale)


def _describe(driver: webdriver.Chrome, css: str) -> str:
    try:
        found = driver.find_elements(By.CSS_SELECTOR, css)
        texts = [e.text for e in found[:5]]
    except Exception as e:
        return f"(could not look: {e})"
    return f"{len(found)} element(s) match {css!r}" + (f", their texts: {texts!r}" if found else "") + \
        f"; page {driver.current_url!r}"


def wait_for_element(driver: webdriver.Chrome, css: str, timeout: float = DEFAULT_TIMEOUT,
                     visible: bool = True) -> WebElement:
    """The first element matching `css` (and displayed, unless visible=False), waiting up to
    `timeout` seconds; fails the test with what the page had instead."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            for element in driver.find_elements(By.CSS_SELECTOR, css):
                if not visible or element.is_displayed():
                    return element
        except StaleElementReferenceException:
            pass
        if time.monotonic() >= deadline:
            what = "a visible element" if visible else "an element"
            pytest.fail(f"no {what} matching {css!r} within {timeout}s: {_describe(driver, css)}")
        time.sleep(0.05)


def wait_for_text(driver: webdriver.Chrome, css: str, text: str, timeout: float = DEFAULT_TIMEOUT) -> WebElement:
    """The first element matching `css` whose rendered text contains `text`, waiting up to
    `timeout` seconds; fails the test with the texts the page had instead."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            for element in driver.find_elements(By.CSS_SELECTOR, css):
                if text in element.text:
                    return element
        except StaleElementReferenceException:
            pass
        if time.monotonic() >= deadline:
            pytest.fail(f"no element matching {css!r} with text {text!r} within {timeout}s: {_describe(driver, css)}")
        time.sleep(0.05)


def current_text(driver: webdriver.Chrome, css: str, timeout: float = DEFAULT_TIMEOUT) -> str:
    """The rendered text of the first element matching `css`, found again when the page
    replaced the element between finding and reading it (a re-render while it is polled)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return driver.find_element(By.CSS_SELECTOR, css).text
        except StaleElementReferenceException:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def screenshot(driver: webdriver.Chrome, path, full_page: bool = False) -> Path:
    """A PNG of the viewport (or of the whole page, full_page=True) at `path`, e.g. for the docs."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if full_page:
        shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path.write_bytes(base64.b64decode(shot["data"]))
    elif not driver.save_screenshot(str(path)):
        raise RuntimeError(f"screenshot to {path} failed")
    return path


def console_log(driver: webdriver.Chrome) -> list[dict]:
    """The browser console's entries since the last call (level, message, source, timestamp):
    console.* calls, uncaught exceptions, failed requests."""
    return driver.get_log("browser")


def console_errors(driver: webdriver.Chrome) -> list[str]:
    """The SEVERE entries of console_log(): a page that works should have none."""
    return [e["message"] for e in console_log(driver) if e.get("level") == "SEVERE"]
