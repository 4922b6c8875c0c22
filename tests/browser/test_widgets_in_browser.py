"""Notebooks 02-04 as a student sees them: JupyterLab 4 in headless Chromium, driven by Selenium.

nbval runs the notebooks in a kernel but renders nothing, so it cannot see a widget that shows
only its `VBox(children=...` text, "Error displaying widget", a JavaScript error, a picture
stretched out of shape or a slider that does nothing. Here each notebook is opened in JupyterLab
and run with Run > Run All Cells, as a student would, and the test checks that

- every code cell ran, in order, and none stored an error (read back from the saved notebook);
- the browser console logged no error;
- every widget rendered, and using it (keyboard on a slider, a click, a dropdown) changes what
  it shows; with what the lessons promise about each: 02's tip (rate 1.0, no [MASK], no random:
  every target kept), a slider wide enough for 03's thousands of examples, 04's heatmap at its
  own size rather than stretched by its box.

JupyterLab saves what it runs, so the notebooks are copied to a temporary folder first, and the
server's settings, workspaces and runtime files live there too. Without selenium, Chromium or
chromedriver the module skips with the reason.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

try:
    from selenium import webdriver
    from selenium.common.exceptions import SessionNotCreatedException, WebDriverException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.remote.webelement import WebElement
    from selenium.webdriver.support.ui import Select, WebDriverWait
except ImportError:
    pytest.skip("selenium is not installed (pip install -e '.[dev]' installs it)",
                allow_module_level=True)

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))),
                None)
CHROMEDRIVER = shutil.which("chromedriver")
if not (CHROMIUM and CHROMEDRIVER):
    missing = " and ".join(n for n, p in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER))
                           if not p)
    pytest.skip(f"{missing} not found on PATH (Debian: apt-get install chromium chromium-driver)",
                allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ("02_masked_lm.ipynb", "03_nsp_data.ipynb", "04_encoder.ipynb")
RUN_ALL_SECONDS = 300     # one notebook, Run All to idle, on a busy 2-core machine
WIDGET_SECONDS = 30       # one widget round trip: browser -> kernel -> browser

# Lab settings for the test server: no "official Jupyter news?" toast over the widgets, and no
# update check (both would reach for the network).
USER_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"fetchNews": "false", "checkForUpdates": False},
    # Every cell in the page, not only those in view, so that a widget far down can be found.
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


# --- the server and the browser ----------------------------------------------------------------

class Lab:
    """A JupyterLab server on 127.0.0.1 serving `root`, and the requests the tests make to it."""

    def __init__(self, root: Path, port: int, token: str):
        self.root, self.port, self.token = root, port, token
        self.url = f"http://127.0.0.1:{port}"

    def api(self, path: str, method: str = "GET"):
        request = urllib.request.Request(f"{self.url}/api/{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def shut_down_kernels(self) -> None:
        """End every session (and its kernel), so one notebook's kernel does not slow the next."""
        for session in self.api("sessions"):
            self.api(f"sessions/{session['id']}", method="DELETE")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[Lab]:
    base = tmp_path_factory.mktemp("lab")
    root, home = base / "root", base / "jupyter"
    (root / "notebooks").mkdir(parents=True)
    for name in NOTEBOOKS:  # they import bertlab, and find the repository's files through it
        shutil.copy(ROOT / "notebooks" / name, root / "notebooks" / name)
    for name, values in USER_SETTINGS.items():
        path = home / "config" / "lab" / "user-settings" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values), encoding="utf-8")
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTER_DATA_DIR=str(home / "data"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               IPYTHONDIR=str(home / "ipython"))
    lab = Lab(root, _free_port(), secrets.token_hex(16))
    lab.env = env  # `jupyter trust` must sign into this server's notary (its data dir)
    command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--port={lab.port}", f"--IdentityProvider.token={lab.token}",
               f"--ServerApp.root_dir={root}"]
    if os.geteuid() == 0:
        command.append("--allow-root")
    log_path = base / "lab.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(command, cwd=root, env=env, stdout=log,
                                  stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                lab.api("status")
                break
            except (urllib.error.URLError, ConnectionError):
                log_tail = log_path.read_text(errors="replace")[-2000:]
                assert server.poll() is None, f"jupyter lab exited:\n{log_tail}"
                assert time.monotonic() < deadline, f"jupyter lab not ready in 60 s:\n{log_tail}"
                time.sleep(0.2)
        yield lab
    finally:
        server.terminate()  # jupyter shuts its kernels down on SIGTERM
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(scope="module")
def driver() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # --no-sandbox: Chromium's sandbox refuses to run as root (containers, CI);
    # --disable-dev-shm-usage: a container's small /dev/shm crashes tabs.
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--window-size=1280,1024"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    except SessionNotCreatedException as error:  # e.g. chromedriver and chromium versions differ
        pytest.skip(f"could not start {CHROMIUM} with {CHROMEDRIVER}: {error.msg}")
    yield browser
    browser.quit()


# --- driving JupyterLab ------------------------------------------------------------------------

# The status bar's kernel item ("Python 3 (ipykernel) | Idle"): the toolbar's indicator already
# reads idle while the page shows "No Kernel | Initializing", and Run All at that moment opens a
# "Select Kernel" dialog.
KERNEL_IDLE = """
return [...document.querySelectorAll('.jp-StatusBar-TextItem')].some(
  item => item.textContent.endsWith('| Idle') && !item.textContent.startsWith('No Kernel'));"""

# Run All has finished when the kernel idles, the toolbar's progress circle (scheduled cells
# done, hidden ones included) is full and no cell shows [*]: the circle still reads 100% from
# before the click, the [*] prompts appear with the click. After an error the cells left show [ ].
RUN_FINISHED = """
const indicator = document.querySelector('.jp-Notebook-ExecutionIndicator');
const progress = indicator.querySelector('[role=progressbar]');
return indicator.dataset.status === 'idle' && progress?.getAttribute('aria-valuenow') === '100'
  && ![...document.querySelectorAll('.jp-InputPrompt')].some(p => p.textContent.includes('*'));"""

TAB_IS_DIRTY = "return document.querySelector('.lm-TabBar-tab.jp-mod-current.jp-mod-dirty') !== null"

# What a broken widget or cell looks like on the page.
PAGE_PROBLEMS = """
const problems = [];
for (const output of document.querySelectorAll('.jp-OutputArea-output')) {
  const text = output.textContent;
  if (text.includes('VBox(children=')) problems.push('a widget shown as text: ' + text.slice(0, 80));
  if (text.includes('Error displaying widget')) problems.push(text.slice(0, 200));
  if (output.dataset.mimeType === 'application/vnd.jupyter.stderr' && text.includes('Traceback'))
    problems.push('a traceback: ' + text.slice(0, 400));
}
return problems;"""


def click_menu(driver: WebDriver, menu: str, item: str) -> None:
    """Click `item` in the menu bar's `menu`, as a student does (e.g. Run > Run All Cells)."""
    wait = WebDriverWait(driver, 10)
    wait.until(lambda d: _by_text(d, ".lm-MenuBar-itemLabel", menu)).click()
    wait.until(lambda d: _by_text(d, ".lm-Menu-itemLabel", item)).click()


def _by_text(root, css: str, text: str) -> WebElement | None:
    return next((e for e in root.find_elements(By.CSS_SELECTOR, css) if e.text == text), None)


def open_and_run_all(driver: WebDriver, lab: Lab, name: str) -> dict:
    """Open a notebook in its own fresh workspace, Run All, save; return the saved notebook."""
    driver.get(f"{lab.url}/lab/workspaces/{Path(name).stem}/tree/notebooks/{name}"
               f"?reset&token={lab.token}")
    WebDriverWait(driver, 60).until(lambda d: d.execute_script(KERNEL_IDLE),
                                    f"{name}: the kernel did not start within 60 s")
    click_menu(driver, "Run", "Run All Cells")
    WebDriverWait(driver, RUN_ALL_SECONDS, poll_frequency=0.5).until(
        lambda d: d.execute_script(RUN_FINISHED), f"{name}: Run All did not finish in "
                                                  f"{RUN_ALL_SECONDS} s")
    click_menu(driver, "File", "Save Notebook")
    WebDriverWait(driver, 30).until(lambda d: not d.execute_script(TAB_IS_DIRTY),
                                    f"{name}: saving did not finish in 30 s")
    return json.loads((lab.root / "notebooks" / name).read_text(encoding="utf-8"))


def run_failures(nb: dict) -> list[str]:
    """Return what went wrong in a saved notebook: cells not run, errors, tracebacks on stderr."""
    problems = []
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    counts = [c["execution_count"] for c in cells]
    if counts != list(range(1, len(cells) + 1)):
        problems.append(f"execution counts {counts}, expected 1..{len(cells)}")
    for i, cell in enumerate(cells, start=1):
        for output in cell["outputs"]:
            if output["output_type"] == "error":
                problems.append(f"code cell {i}: {output['ename']}: {output['evalue']}")
            elif output.get("name") == "stderr" and "Traceback" in "".join(output["text"]):
                problems.append(f"code cell {i} printed a traceback:\n{''.join(output['text'])}")
    return problems


def console_errors(driver: WebDriver) -> list[str]:
    """Return (and clear) the browser console's errors since the last call."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def widgets_on_page(driver: WebDriver) -> list[WebElement]:
    """Return the outermost rendered widget of every widget output on the page."""
    return driver.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output > .jupyter-widgets")


def wait_for_change(driver: WebDriver, read: Callable[[], str], before: str, what: str) -> str:
    """Wait until `read()` differs from `before` (the kernel answered); return the new value."""
    WebDriverWait(driver, WIDGET_SECONDS).until(lambda _: read() != before,
                                                f"{what} did not change what the widget shows")
    return read()


def html_text(widget: WebElement) -> str:
    return widget.find_element(By.CSS_SELECTOR, ".widget-html-content").text


def press_on_slider(driver: WebDriver, widget: WebElement, index: int, key: str) -> None:
    """Give the `index`-th slider of `widget` the keyboard focus and press `key` on it."""
    handle = widget.find_elements(By.CSS_SELECTOR, ".noUi-handle")[index]
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", handle)
    handle.send_keys(key)


# --- one interaction per widget ----------------------------------------------------------------

def use_masking_explorer(driver: WebDriver, widget: WebElement) -> None:
    def summary() -> str:  # "draw 0: 5 targets out of 40 tokens (4 [MASK], 0 random, 1 kept; ...)"
        return html_text(widget).splitlines()[0]

    before = summary()
    # The lesson's tip: at a rate of 1.0, with `→ [MASK]` and `→ random` at 0, every word piece
    # is a target ([CLS] and [SEP] never are) and every target is kept. End and Home move a
    # focused slider to its maximum and minimum.
    press_on_slider(driver, widget, 0, Keys.END)   # mlm_probability -> 1.0
    wait_for_change(driver, summary, before, "mlm_probability's slider")
    press_on_slider(driver, widget, 1, Keys.HOME)  # → [MASK] -> 0
    press_on_slider(driver, widget, 2, Keys.HOME)  # → random -> 0
    WebDriverWait(driver, WIDGET_SECONDS).until(
        lambda _: "kept share setting 1.0" in summary(), "→ [MASK] and → random did not reach 0")
    counts = re.search(r"(\d+) targets out of (\d+) tokens \((\d+) \[MASK\], (\d+) random, "
                       r"(\d+) kept", summary())
    assert counts, summary()
    targets, tokens, masked, randomized, kept = map(int, counts.groups())
    assert (masked, randomized) == (0, 0) and targets == kept == tokens - 2, summary()

    before = summary()
    resample = _by_text(widget, "button", "resample")
    assert resample is not None, "the masking explorer has no resample button"
    resample.click()
    wait_for_change(driver, summary, before, "the resample button")


def use_nsp_explorer(driver: WebDriver, widget: WebElement) -> None:
    slider = widget.find_element(By.CSS_SELECTOR, ".widget-slider")
    # Thousands of examples: at the default width (300 px, label included) dragging the
    # handle skips about a hundred of them per pixel.
    assert slider.size["width"] >= 400, f"the example slider is {slider.size['width']} px wide"
    before = html_text(widget)
    assert before.startswith("1 of ")
    press_on_slider(driver, widget, 0, Keys.ARROW_RIGHT)
    after = wait_for_change(driver, lambda: html_text(widget), before, "the example slider")
    assert after.startswith("2 of ")


def use_attention_heatmap(driver: WebDriver, widget: WebElement) -> None:
    image = widget.find_element(By.TAG_NAME, "img")

    natural_w, natural_h, shown_w, shown_h = driver.execute_script(
        "const i = arguments[0]; return [i.naturalWidth, i.naturalHeight, i.clientWidth, "
        "i.clientHeight]", image)
    # A box that stretches the picture makes it blurry and taller than the screen.
    assert (shown_w, shown_h) == (natural_w, natural_h), (
        f"the heatmap ({natural_w}x{natural_h} px) is shown at {shown_w}x{shown_h}")
    head = widget.find_elements(By.TAG_NAME, "select")[1]
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", head)
    before = image.get_attribute("src")
    Select(head).select_by_visible_text("2")
    wait_for_change(driver, lambda: image.get_attribute("src"), before, "choosing head 2")


INTERACTIONS = {
    "02_masked_lm.ipynb": [use_masking_explorer],
    "03_nsp_data.ipynb": [use_nsp_explorer],
    "04_encoder.ipynb": [use_attention_heatmap],
}


# --- the tests ---------------------------------------------------------------------------------

def keep_screenshot(driver: WebDriver, lab: Lab, stem: str) -> None:
    """Save what the page showed when a check failed, beside the lab's folder, and say where."""
    screenshot = lab.root.parent / f"{stem}.png"
    driver.save_screenshot(str(screenshot))
    print(f"screenshot of the page: {screenshot}")


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_and_its_widgets_work_in_jupyterlab(lab, driver, name):
    console_errors(driver)  # start from an empty log
    try:
        failures = run_failures(open_and_run_all(driver, lab, name))
        assert not failures, f"{name}:\n" + "\n".join(failures)
        assert not (problems := driver.execute_script(PAGE_PROBLEMS)), f"{name}: {problems}"
        rendered = widgets_on_page(driver)
        assert len(rendered) == len(INTERACTIONS[name]), (
            f"{name}: {len(rendered)} rendered widgets, expected {len(INTERACTIONS[name])}")
        for widget, interact in zip(rendered, INTERACTIONS[name], strict=True):
            interact(driver, widget)
        assert not (problems := driver.execute_script(PAGE_PROBLEMS)), f"{name}: {problems}"
        errors = console_errors(driver)
        assert not errors, f"{name}: browser console errors:\n" + "\n".join(errors)
    except (AssertionError, WebDriverException):
        keep_screenshot(driver, lab, f"{Path(name).stem}-failure")
        raise
    finally:
        lab.shut_down_kernels()


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_a_freshly_opened_notebook_draws_its_saved_widgets_before_anything_runs(lab, driver,
                                                                                 name):
    # The notebook is stored with its widget state (tools/run_notebooks.py), so a student who
    # opens it sees the widgets of the stored run, not their `VBox(children=...` text. JupyterLab
    # draws stored widgets (and other active output) only for a trusted notebook: `make lab`
    # trusts the course's notebooks, as this test does.
    console_errors(driver)
    copy = lab.root / "notebooks" / name
    shutil.copy(ROOT / "notebooks" / name, copy)  # as committed
    subprocess.run([sys.executable, "-m", "jupyter", "trust", str(copy)], env=lab.env, check=True,
                   capture_output=True)
    driver.get(f"{lab.url}/lab/workspaces/{Path(name).stem}-open/tree/notebooks/{name}"
               f"?reset&token={lab.token}")
    try:
        WebDriverWait(driver, 60).until(
            lambda d: len(widgets_on_page(d)) >= len(INTERACTIONS[name]),
            f"{name}: the saved widgets were not drawn within 60 s of opening it")
        assert not (problems := driver.execute_script(PAGE_PROBLEMS)), f"{name}: {problems}"
        prompts = [p.text for p in driver.find_elements(By.CSS_SELECTOR, ".jp-InputPrompt")]
        assert not any("*" in p for p in prompts), f"{name}: a cell ran on opening: {prompts}"
    except (AssertionError, WebDriverException):
        keep_screenshot(driver, lab, f"{Path(name).stem}-open-failure")
        raise
    finally:
        lab.shut_down_kernels()
