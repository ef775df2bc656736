"""The dashboard in headless Chromium: set a setting, send a message, see the trace.

Starts `loadout serve` (binary from LOADOUT_BIN) on a free loopback port with a fresh
LOADOUT_DATA_DIR, and drives Debian's chromium through /usr/bin/chromedriver
(packages `chromium` and `chromium-driver`; Python package `selenium`). Without them
the test is skipped, unless LOADOUT_REQUIRE_BROWSER=1 makes that a failure.
LOADOUT_SCREENSHOT=PATH keeps a screenshot of the final page.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
WAIT_SECONDS = 20


def missing(reason):
    if os.environ.get("LOADOUT_REQUIRE_BROWSER") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


# The data dir of each running server, by its URL (for the CLI beside it).
DATA_DIRS = {}


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def server():
    binary = os.environ.get("LOADOUT_BIN")
    if not binary or not Path(binary).exists():
        missing("LOADOUT_BIN does not name the loadout binary")
    data_dir = tempfile.mkdtemp(prefix="loadout-dashboard-")
    port = free_port()
    env = dict(os.environ, LOADOUT_DATA_DIR=data_dir)
    env.pop("LOADOUT_DATABASE_URL", None)
    process = subprocess.Popen(
        [binary, "serve", "--addr", f"127.0.0.1:{port}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        try:
            with urllib.request.urlopen(url + "/", timeout=1) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
            pytest.fail(f"loadout serve did not start: {stderr}")
        time.sleep(0.1)
    DATA_DIRS[url] = data_dir
    yield url
    DATA_DIRS.pop(url, None)
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
    shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    if not Path(CHROMEDRIVER).exists():
        missing(f"{CHROMEDRIVER} missing (Debian packages chromium, chromium-driver)")
    profile = tempfile.mkdtemp(prefix="loadout-chromium-")
    options = webdriver.ChromeOptions()
    if Path(CHROMIUM).exists():
        options.binary_location = CHROMIUM
    for flag in [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1400,1000",
        f"--user-data-dir={profile}",
    ]:
        options.add_argument(flag)
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(options=options, service=service)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def api_get(url):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def test_set_a_setting_send_a_message_see_the_trace(server, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, WAIT_SECONDS)
    browser.get(server + "/")
    assert browser.title == "Loadout"

    # The filesystem domain starts inactive: it needs `filesystem_roots`.
    filesystem = '.domain[data-domain="filesystem"]'
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, filesystem + '[data-active="false"]')))
    assert "no model configured" in browser.find_element(By.ID, "model-status").text

    # Set the setting through its form.
    root = tmp_path / "files"
    root.mkdir()
    (root / "notes.txt").write_text("hello")
    field = browser.find_element(By.CSS_SELECTOR, 'form.setting[data-key="filesystem_roots"] input')
    field.send_keys(json.dumps([str(root)]))
    browser.find_element(By.CSS_SELECTOR, 'form.setting[data-key="filesystem_roots"] button.save').click()
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, filesystem + '[data-active="true"]')))
    stored = api_get(server + "/api/settings/filesystem_roots")
    assert json.loads(stored["value"]) == [str(root)]

    # Send a message: with no model configured, the page routes it and shows the trace.
    message = browser.find_element(By.ID, "message")
    message.send_keys("read the file notes.txt in my folder")
    browser.find_element(By.ID, "send").click()
    row = '#trace .turn tr[data-domain="filesystem"]'
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, row)))
    cells = [td.text for td in browser.find_elements(By.CSS_SELECTOR, row + " td")]
    assert cells[0] == "filesystem"
    assert cells[1] == "sent"
    assert cells[2] in ("keyword", "bm25", "dense", "fused"), cells
    assert float(cells[3]) > 0
    # Each tool the domain sent, with its probability and what raised it.
    tools = browser.find_elements(By.CSS_SELECTOR, row + " .tool")
    assert tools, cells
    for tool in tools:
        assert tool.text.startswith(tool.get_attribute("data-tool") + " "), tool.text
    assert any(": " in tool.text for tool in tools), [tool.text for tool in tools]
    trace = browser.find_element(By.ID, "trace").text
    assert "Turn 1" in trace
    assert "tokens sent of" in trace
    assert "[router]" in trace
    session = browser.find_element(By.ID, "session-id").text
    assert session != "new"
    assert api_get(f"{server}/api/sessions/{session}")["turn"] == 1

    # A second message in the same session: the trace grows by one turn.
    message.send_keys("thanks")
    browser.find_element(By.ID, "send").click()
    wait.until(lambda driver: len(driver.find_elements(By.CSS_SELECTOR, "#trace .turn")) == 2)

    screenshot = os.environ.get("LOADOUT_SCREENSHOT")
    if screenshot:
        browser.save_screenshot(screenshot)


class FakeModel:
    """An OpenAI-compatible chat endpoint on loopback: the first step asks for
    `calculate`, the next answers after a pause (so the page shows the tool step
    before the answer exists, which only a live stream can do)."""

    def __init__(self, pause_seconds):
        import http.server
        import threading

        pause = pause_seconds

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", "0"))
                request = json.loads(self.rfile.read(length) or b"{}")
                messages = request.get("messages", [])
                if messages and messages[-1].get("role") == "tool":
                    time.sleep(pause)
                    message = {"role": "assistant", "content": "The answer is 42."}
                    finish = "stop"
                else:
                    message = {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call-1",
                                "type": "function",
                                "function": {"name": "calculate", "arguments": json.dumps({"expression": "6*7"})},
                            }
                        ],
                    }
                    finish = "tool_calls"
                body = json.dumps(
                    {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def api_put(url, value):
    request = urllib.request.Request(
        url,
        data=json.dumps({"value": value}).encode(),
        headers={"Content-Type": "application/json"},
        method="PUT",
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def test_a_chat_turn_streams_its_steps_live(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    model = FakeModel(pause_seconds=3)
    try:
        api_put(server + "/api/settings/llm_base_url", model.url)
        api_put(server + "/api/settings/llm_model", "fake")
        wait = WebDriverWait(browser, WAIT_SECONDS)
        browser.get(server + "/")
        wait.until(EC.text_to_be_present_in_element((By.ID, "model-status"), "model fake"))

        browser.find_element(By.ID, "message").send_keys("what is 6 times 7")
        browser.find_element(By.ID, "send").click()

        # The tool step shows while the model is still thinking about its answer.
        wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#log .msg.tool")))
        log = browser.find_element(By.ID, "log").text
        assert "calculate" in log, log
        assert "42" in log, log  # the tool's own result
        assert "The answer is 42." not in log, "the answer arrived with the tool step: not streamed"
        assert browser.find_elements(By.CSS_SELECTOR, "#trace .turn"), "the selection shows first"

        # Then the answer arrives and the turn ends.
        wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#log .msg.final")))
        assert "The answer is 42." in browser.find_element(By.CSS_SELECTOR, "#log .msg.final").text
        wait.until(lambda driver: driver.find_element(By.ID, "send").is_enabled())

        # The audit log's newest call: the tool that ran, at an ISO 8601 UTC time.
        wait.until(EC.text_to_be_present_in_element((By.ID, "audit"), "calculate"))
        stamp = browser.find_element(By.CSS_SELECTOR, "#audit tbody tr time").get_attribute("datetime")
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp or ""), stamp
    finally:
        model.close()


def test_the_clients_section_lists_each_client_with_its_calls(server, browser):
    """Issue 40: a client added with `loadout clients add` shows on the dashboard with
    what it may see, its rate and its calls (none yet)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, WAIT_SECONDS)
    browser.get(server + "/")
    wait.until(EC.text_to_be_present_in_element((By.ID, "clients"), "No client yet"))
    env = dict(os.environ, LOADOUT_DATA_DIR=DATA_DIRS[server])
    env.pop("LOADOUT_DATABASE_URL", None)
    added = subprocess.run(
        [os.environ["LOADOUT_BIN"], "clients", "add", "notes-agent", "--domains", "memory", "--rate", "30/min", "--read-only"],
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_SECONDS,
    )
    assert added.returncode == 0, added.stderr
    browser.get(server + "/")
    row = '#clients tr[data-client="notes-agent"]'
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, row)))
    cells = [td.text for td in browser.find_elements(By.CSS_SELECTOR, row + " td")]
    assert cells[:6] == ["notes-agent", "memory", "-", "30/min", "read-only", "0"], cells
    listed = api_get(server + "/api/clients")["clients"]
    assert [c["name"] for c in listed] == ["notes-agent"]
