"""The lab as its users meet it: JupyterLab (started as `labkit lab` starts it) driven by a real headless
Chromium through Selenium. The quickstart runs in smoke mode through the Run menu on the real CPU engine with no
error output; the explorer's metric is changed in its widget and what it shows changes; a committed evidence
notebook left open past several autosave intervals is byte for byte what was committed, is not marked modified,
and closes without a prompt. A screenshot of each
step is kept under data/runs/browser-<UTC>/."""
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import nbformat
import pytest

from labkit import settings
from labkit.measure.served import free_port
from labkit.present.lab import lab_command

ROOT = settings.ROOT
EVIDENCE = "data/baselines/h200/cuda_graphs.ipynb"
# JupyterLab hides the other tabs by scaling them to nothing, not with a class: the notebook in view is the
# shell's current widget
IN_VIEW = "window.jupyterapp.shell.currentWidget.node"
AUTOSAVE_S = 2  # the lab's autosave interval here (JupyterLab's default is 120 s)

pytestmark = pytest.mark.browser


def _with_smoke(source: Path, target: Path) -> None:
    """The notebook with `smoke = True` in its parameters cell, as a user would set it before Run All."""
    nb = nbformat.read(source, 4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    assert "smoke: bool = False" in cell.source, cell.source
    cell.source = cell.source.replace("smoke: bool = False", "smoke: bool = True")
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)


def _user_settings(folder: Path) -> Path:
    """JupyterLab settings for the test: a short autosave interval (so an autosave would happen while the
    evidence is open), every cell kept in the page, no news or update checks."""
    for plugin, values in {"docmanager-extension/plugin": {"autosave": True, "autosaveInterval": AUTOSAVE_S},
                           "notebook-extension/tracker": {"windowingMode": "none"},
                           "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False}
                           }.items():
        path = folder / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    return folder


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab on a copy of the lab's root: the two notebooks set to smoke, one evidence notebook as committed."""
    tmp = tmp_path_factory.mktemp("browser")
    root = tmp / "lab"
    _with_smoke(ROOT / "notebooks" / "00_quickstart.ipynb", root / "notebooks" / "00_quickstart.ipynb")
    _with_smoke(ROOT / "notebooks" / "explore.ipynb", root / "notebooks" / "explore.ipynb")
    (root / EVIDENCE).parent.mkdir(parents=True)
    shutil.copyfile(ROOT / EVIDENCE, root / EVIDENCE)
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("raise ValueError('seen')")],
                                            metadata=kernel), root / "notebooks" / "fails.ipynb")
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "LABKIT_RESULTS_DIR": str(tmp / "results"), "LABKIT_JOURNAL": str(tmp / "journal.jsonl")}
    log = open(tmp / "jupyterlab.log", "w")
    server = subprocess.Popen(lab_command(root, port=port, token=token, settings_dir=_user_settings(tmp / "settings"),
                                          root_user=os.geteuid() == 0)
                              + ["--no-browser", "--LabApp.expose_app_in_browser=True",  # its model, read below
                                 # a workspace of its own: JupyterLab would reopen the tabs of any earlier lab
                                 f"--LabApp.workspaces_dir={tmp / 'workspaces'}"],
                              env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                assert server.poll() is None, (tmp / "jupyterlab.log").read_text()[-3000:]
                time.sleep(0.5)
        yield {"url": url, "token": token, "root": root, "log": tmp / "jupyterlab.log"}
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and the kernels it started
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1500,1100"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.set_script_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def shots():
    folder = settings.current().runs_dir / f"browser-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
    folder.mkdir(parents=True, exist_ok=True)
    count = iter(range(1, 100))
    return lambda driver, name: driver.save_screenshot(str(folder / f"{next(count):02d}-{name}.png"))


def wait_for(condition, timeout_s: float, what: str, driver=None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    page = ""
    if driver:
        driver.save_screenshot(str(settings.current().runs_dir / "browser-failure.png"))
        page = driver.find_element("css selector", "body").text[-2000:]
    raise AssertionError(f"not within {timeout_s} s: {what}\n{page}")


def open_notebook(driver, lab, path: str) -> None:
    driver.get(f"{lab['url']}/lab/tree/{path}?token={lab['token']}")
    wait_for(lambda: driver.execute_script(  # the app is up and the notebook in view is this one
        "const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
        "return w && w.context && w.context.path === arguments[0] && w.node.querySelectorAll('.jp-CodeCell').length",
        path), 90, f"{path} shown", driver)
    wait_for(lambda: driver.execute_script(  # the kernel started and idle: the toolbar's status says so, and the
        f"const s = {IN_VIEW}.querySelector('.jp-Notebook-ExecutionIndicator');"  # session holds it
        "const kernel = window.jupyterapp.shell.currentWidget.sessionContext?.session?.kernel;"
        "return s && s.getAttribute('data-status') === 'idle' && !!kernel && kernel.status === 'idle'"),
        90, f"{path}'s kernel idle", driver)
    dialogs = [d.text for d in driver.find_elements("css selector", ".jp-Dialog")]
    assert not dialogs, f"a dialog opened with {path}: {dialogs}"


def run_all_from_the_menu(driver) -> None:
    # the Run menu acts on the notebook last activated, which may be a tab the workspace restored beside this
    # one: the notebook in view is made the active one, as a click on its tab would. On a fresh start the
    # notebook tracker can take a moment to follow, and until it does "Run All Cells" is drawn disabled and a
    # click on it does nothing (seen: the first test's cell never ran): the menu is opened until it is enabled
    from selenium.common.exceptions import ElementClickInterceptedException
    from selenium.webdriver.common.keys import Keys

    def enabled_item():
        driver.execute_script("const shell = window.jupyterapp.shell; shell.activateById(shell.currentWidget.id)")
        menu = next(m for m in driver.find_elements("css selector", ".lm-MenuBar-item") if m.text.strip() == "Run")
        try:
            menu.click()
        except ElementClickInterceptedException:  # a first start's dialog or toast over the menu bar (seen on a
            driver.switch_to.active_element.send_keys(Keys.ESCAPE)  # busy machine): dismissed, then asked again
            return None
        items = wait_for(lambda: [i for i in driver.find_elements("css selector", ".lm-Menu-item")
                                  if i.text.strip().startswith("Run All Cells")], 10, "the Run menu open", driver)
        if "lm-mod-disabled" not in (items[0].get_attribute("class") or ""):
            return items[0]
        menu.click()  # closes the menu again
        return None

    def accept_kernel_choice() -> None:
        # Run All on a notebook whose session has no kernel at that moment asks which kernel to start (seen once
        # on a busy machine, moments after the toolbar had shown its kernel idle): a user takes the one offered,
        # the notebook's own
        for dialog in driver.find_elements("css selector", ".jp-Dialog"):
            if "select kernel" in dialog.text.lower():
                dialog.find_element("css selector", ".jp-mod-accept").click()

    def started():  # a prompt left "[ ]:" (never queued) on every cell and a kernel not busy: the click did not take
        accept_kernel_choice()
        prompts, status = driver.execute_script(
            f"return [[...{IN_VIEW}.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(x => x.textContent.trim()),"
            f"{IN_VIEW}.querySelector('.jp-Notebook-ExecutionIndicator')?.getAttribute('data-status')]")
        return any(p != "[ ]:" for p in prompts) or status == "busy"
    for attempt in range(3):
        # a click that took but was drawn late (a busy machine) must not be clicked again: a second Run All runs
        # every cell again, and the second run finds its arms stored and prints none of the first run's lines
        if attempt and started():
            return
        try:
            wait_for(enabled_item, 30, "Run All Cells enabled in the Run menu", driver).click()
        except ElementClickInterceptedException:  # something drawn over the open menu: dismissed, asked again
            driver.switch_to.active_element.send_keys(Keys.ESCAPE)
            continue
        try:
            wait_for(started, 45, "the cells queued after Run All Cells", driver if attempt else None)
        except AssertionError:
            if attempt:
                raise
            continue
        return


def run_the_rest(driver) -> None:
    """Run the cells from the first one not yet run, once each, as "Run Selected Cell and All Below" runs them."""
    driver.execute_script("""
        const w = window.jupyterapp.shell.currentWidget, cells = w.content.model.cells;
        for (let i = 0; i < cells.length; i++)
          if (cells.get(i).type === "code" && cells.get(i).executionCount === null) {
            w.content.activeCellIndex = i;
            return window.jupyterapp.commands.execute("notebook:run-all-below");
          }""")


def ran_once(driver) -> list:
    """The execution counts of the notebook in view: 1, 2, ... when Run All ran every cell once on a fresh kernel."""
    return driver.execute_script("""
        const cells = window.jupyterapp.shell.currentWidget.content.model.cells, counts = [];
        for (let i = 0; i < cells.length; i++)
          if (cells.get(i).type === "code") counts.push(cells.get(i).executionCount);
        return counts;""")


def wait_until_every_cell_ran(driver, timeout_s: float) -> None:
    """Until every code cell has an execution count and the kernel is idle; an error output ends the wait (Run
    All stops at it), and the caller's check of errors_shown then says which."""
    state = lambda: driver.execute_script(
        f"const p = [...{IN_VIEW}.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];"
        f"const s = {IN_VIEW}.querySelector('.jp-Notebook-ExecutionIndicator');"
        "return [s && s.getAttribute('data-status'), p.map(x => x.textContent.trim())]")
    nudged = []

    def done(status, prompts) -> bool:
        if status != "idle" or not prompts:
            return False
        ran = [bool(re.fullmatch(r"\[\d+\]:", p)) for p in prompts]
        if all(ran) or errors_shown(driver):
            return True
        # Run All on a session whose kernel it had to start first (or choose: accept_kernel_choice) ran the first
        # cell only, with nothing queued after it and no error; a user runs the rest, once
        if any(ran) and "[*]:" not in prompts and not nudged:
            run_the_rest(driver)
            nudged.append(True)
        return False
    try:
        wait_for(lambda: done(*state()), timeout_s, "every cell executed", driver)
    except AssertionError:
        raise AssertionError(f"cells not done within {timeout_s} s: kernel and prompts {state()}")


def errors_shown(driver) -> list[str]:
    """The error outputs of the notebook in view, from JupyterLab's own model of it (on the page, an error and a
    warning on stderr are drawn alike)."""
    return driver.execute_script("""
        const cells = window.jupyterapp.shell.currentWidget.content.model.cells, found = [];
        for (let i = 0; i < cells.length; i++) {
          const outputs = cells.get(i).outputs;
          for (let j = 0; outputs && j < outputs.length; j++) {
            const o = outputs.get(j).toJSON();
            if (o.output_type === "error") found.push(`${o.ename}: ${o.evalue}`);
          }
        }
        return found;""")


def outputs_shown(driver) -> str:
    """The text of every output of the notebook in view, as JupyterLab renders it (the HTML form where there is
    one, else the plain text or the stream), from its model: the page's own text leaves out cells scrolled away."""
    return driver.execute_script("""
        const cells = window.jupyterapp.shell.currentWidget.content.model.cells, found = [];
        const asText = html => {
          const doc = new DOMParser().parseFromString(html, "text/html");
          doc.querySelectorAll("style, script").forEach(e => e.remove());
          return doc.body.textContent;
        };
        for (let i = 0; i < cells.length; i++) {
          const outputs = cells.get(i).outputs;
          for (let j = 0; outputs && j < outputs.length; j++) {
            const o = outputs.get(j).toJSON(), data = o.data || {};
            const join = v => Array.isArray(v) ? v.join("") : (v || "");
            if (o.output_type === "stream") found.push(join(o.text));
            else if (data["text/html"]) found.push(asText(join(data["text/html"])));
            else if (data["text/plain"]) found.push(join(data["text/plain"]));
          }
        }
        return found.join("\\n");""")


def test_a_cell_that_raises_is_seen_as_an_error_output(lab, browser, shots):
    """The error check below can fail: a traceback in a cell is found by it."""
    open_notebook(browser, lab, "notebooks/fails.ipynb")
    run_all_from_the_menu(browser)
    wait_until_every_cell_ran(browser, 60)
    shots(browser, "a-failing-cell")
    assert errors_shown(browser) == ["ValueError: seen"]


def test_the_quickstart_runs_in_smoke_mode_from_the_run_menu_with_no_error(lab, browser, shots):
    open_notebook(browser, lab, "notebooks/00_quickstart.ipynb")
    shots(browser, "quickstart-opened")
    run_all_from_the_menu(browser)
    wait_until_every_cell_ran(browser, 600)
    shots(browser, "quickstart-done")
    assert errors_shown(browser) == []
    counts = ran_once(browser)
    assert counts == list(range(1, len(counts) + 1)), f"the cells did not run once each, in order: {counts}"
    text = outputs_shown(browser)
    assert "complete in" in text, text[-3000:]  # the plain per-arm line of a finished arm
    # what a reader sees: values with their intervals, changes in percent; no scientific notation, no cut cell
    assert re.search(r"\d \[\d[\d.]* ?, \d", text) and re.search(r"[+-]\d+\.\d%", text), text[-3000:]
    assert not re.search(r"\d\.\d+e[+-]\d\d", text) and "Styler object" not in text, text[-3000:]


def test_the_explorer_answers_a_moved_widget(lab, browser, shots):
    from selenium.webdriver.support.ui import Select

    open_notebook(browser, lab, "notebooks/explore.ipynb")
    run_all_from_the_menu(browser)
    wait_until_every_cell_ran(browser, 180)
    assert errors_shown(browser) == []
    shown = lambda: " ".join(o.text for o in browser.find_elements("css selector", ".widget-output"))
    metric = wait_for(lambda: [s for s in browser.find_elements("css selector", ".widget-dropdown")
                               if s.find_element("css selector", "label").text == "metric"], 60,
                      "the explorer's metric dropdown", browser)[0]
    choice = Select(metric.find_element("css selector", "select"))
    first = choice.first_selected_option.text  # the explorer picks the experiment's own headline metric
    wait_for(lambda: first in shown(), 60, f"the explorer's first table ({first})", browser)
    shots(browser, "explorer-first-metric")
    before = shown()
    moved_to = "ttft_p50_ms" if first != "ttft_p50_ms" else "output_tok_s"
    choice.select_by_visible_text(moved_to)
    wait_for(lambda: moved_to in shown() and shown() != before, 60, f"the table for {moved_to}", browser)
    shots(browser, "explorer-moved")


def test_committed_evidence_left_open_is_not_changed(lab, browser, shots):
    committed = (ROOT / EVIDENCE).read_bytes()
    open_notebook(browser, lab, EVIDENCE)
    time.sleep(5 * AUTOSAVE_S)  # a writable modified document would have been autosaved by now
    shots(browser, "evidence-open")
    assert (lab["root"] / EVIDENCE).read_bytes() == committed
    # served with the kernel facts the started kernel writes, the document is not modified: no mark on its tab
    widget = "window.jupyterapp.shell.currentWidget"
    assert browser.execute_script(f"return {widget}.context.model.dirty") is False
    assert not browser.execute_script(f"return {widget}.title.className.includes('jp-mod-dirty')")
    # ... and closing it asks nothing
    browser.execute_script(f"{widget}.close()")
    time.sleep(2)
    shots(browser, "evidence-closed")
    assert browser.find_elements("css selector", ".jp-Dialog") == [], "closing the evidence asked to save it"
    assert (lab["root"] / EVIDENCE).read_bytes() == committed
