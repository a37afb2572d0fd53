"""`koans viz`: the page is drawn from a chapter 10 trace and its slider works, in a real browser.

The browser test drives Debian's headless Chromium through ChromeDriver's
WebDriver protocol (plain HTTP + JSON, so no Python package is needed).
It skips when Chromium is not installed, unless $KOANS_REQUIRE_BROWSER is set:
.ci/run installs Chromium and sets it, so in CI the test always runs.
"""

import base64
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from koans.learn import viz
from koans.learn.timeline import Span, write_chrome_trace

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ARROW_RIGHT = "\ue014"  # the WebDriver key code of the right arrow


def synthetic_trace(path: Path) -> Path:
    """A lock-step chapter 10 run: 2 generators make 4 groups (2 each, 0.1 s), then the trainer
    trains (0.2 s) and publishes (0.02 s), for 5 steps. Durations round, so the replay is checkable."""
    spans, t = [], 0.0
    for step in range(5):
        for gen in range(2):
            spans.append(Span(f"generator{gen}", "sync", t, t + 0.01))
            spans += [Span(f"generator{gen}", "generate", t + 0.01 + 0.1 * k, t + 0.11 + 0.1 * k) for k in range(2)]
        t += 0.21
        spans.append(Span("trainer", "train", t, t + 0.2, {"groups": 4, "samples": 32}))
        spans.append(Span("trainer", "sync", t + 0.2, t + 0.22))
        t += 0.22
    write_chrome_trace(spans, str(path))
    return path


def test_trace_reading_and_durations(tmp_path):
    spans = viz.read_trace(synthetic_trace(tmp_path / "trace.json"))
    d = viz.durations(spans)
    assert (d["generators"], d["groups_per_step"], d["samples_per_group"]) == (2, 4, 8)
    assert len(d["generate"]) == 20 and all(abs(x - 0.1) < 1e-6 for x in d["generate"])
    assert len(d["train"]) == 5 and all(abs(x - 0.2) < 1e-6 for x in d["train"])
    page = viz.build_page(spans, "trace.json")
    assert "/*DATA*/" not in page and "http://" not in page and "https://" not in page, "self-contained, no network"


def test_the_page_shows_the_measured_ratio_beside_the_replay(tmp_path):
    spans = viz.read_trace(synthetic_trace(tmp_path / "trace.json"))
    data = json.loads(viz.build_page(spans, "t", measured={"sync": 100.0, "async": 108.0, "machine": "m"})
                      .split("const DATA = ", 1)[1].split(";\n", 1)[0])
    assert data["measured"] == {"sync": 100.0, "async": 108.0, "machine": "m"}
    (tmp_path / "compare.json").write_text('{"sync": 489.0, "async": 529.0, "machine": "2 cores"}')
    assert viz.read_measured(tmp_path / "compare.json") == {"sync": 489.0, "async": 529.0, "machine": "2 cores"}
    assert viz.read_measured(tmp_path / "missing.json") is None


def test_a_chapter_12_trace_draws_its_tool_calls_in_their_own_color(tmp_path):
    spans = viz.read_trace(synthetic_trace(tmp_path / "trace.json"))
    write_chrome_trace([Span(s["actor"], s["kind"], s["start"], s["end"]) for s in spans]
                       + [Span("tool0", "tool", 0.05, 0.15, {"request": "c"})], str(tmp_path / "ch12.json"))
    page = viz.build_page(viz.read_trace(tmp_path / "ch12.json"), "ch12.json")
    data = json.loads(page.split("const DATA = ", 1)[1].split(";\n", 1)[0])
    assert [s["actor"] for s in data["spans"] if s["kind"] == "tool"] == ["tool0"], "the tool lane is on the page"
    colors = page.split("const COLORS = ", 1)[1].split(";", 1)[0]
    assert "tool:" in colors, f"tool calls get a color and a legend entry of their own: {colors}"


def test_the_sweep_page_draws_each_correction(tmp_path):
    cells = {f"{lag}/{c}": {"mean": 0.1 * lag + 0.01 * i, "spread": 0.02, "mean_ess": 1.0 - 0.05 * lag}
             for lag in (0, 2) for i, c in enumerate(("none", "clip", "tis", "decoupled"))}
    report = {"lags": [0, 2], "corrections": ["none", "clip", "tis", "decoupled"], "seeds": [0], "steps": 3, "cells": cells}
    (tmp_path / "sweep.json").write_text(json.dumps(report))
    assert viz.main(None, str(tmp_path / "sweep.html"), sweep=str(tmp_path / "sweep.json")) == 0
    page = (tmp_path / "sweep.html").read_text()
    assert page.count("<polyline") == 4 and "0.23 &plusmn; 0.02" in page and "http" not in page
    (tmp_path / "bad.json").write_text("{}")
    assert viz.main(None, str(tmp_path / "x.html"), sweep=str(tmp_path / "bad.json")) == 2


def test_a_missing_or_wrong_trace_says_what_to_do(tmp_path):
    with pytest.raises(viz.TraceError, match="python -m solutions.ch10_qwen_grpo --trace"):
        viz.read_trace(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text('{"traceEvents": [{"ph": "X", "name": "x", "tid": 0, "ts": 0, "dur": 1}]}')
    with pytest.raises(viz.TraceError, match="chapter 10 timeline"):
        viz.read_trace(tmp_path / "bad.json")


# --- In a real browser --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebDriver:
    """Just enough of the W3C WebDriver protocol: open a page, find, type, read, screenshot."""

    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"
        options = {"binary": CHROMIUM, "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                                                "--no-first-run", "--disable-background-networking",
                                                "--disable-component-update", "--disable-sync",
                                                "--window-size=1200,1000"]}
        reply = self.call("POST", "/session", {"capabilities": {"alwaysMatch": {"goog:chromeOptions": options}}})
        self.session = f"/session/{reply['sessionId']}"

    def call(self, method: str, path: str, body: dict | None = None):
        data = json.dumps(body or {}).encode() if method == "POST" else None
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())["value"]

    def open(self, url: str) -> None:
        self.call("POST", f"{self.session}/url", {"url": url})

    def find(self, css: str) -> str:
        found = self.call("POST", f"{self.session}/element", {"using": "css selector", "value": css})
        return next(iter(found.values()))

    def text(self, css: str) -> str:
        return self.call("GET", f"{self.session}/element/{self.find(css)}/text")

    def attribute(self, css: str, name: str) -> str:
        return self.call("GET", f"{self.session}/element/{self.find(css)}/attribute/{name}")

    def type(self, css: str, keys: str) -> None:
        self.call("POST", f"{self.session}/element/{self.find(css)}/value", {"text": keys})

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.call("GET", f"{self.session}/screenshot")))

    def quit(self) -> None:
        self.call("DELETE", self.session)


@pytest.fixture
def browser():
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        if os.environ.get("KOANS_REQUIRE_BROWSER"):
            pytest.fail(f"Chromium or ChromeDriver missing ({CHROMIUM}, {CHROMEDRIVER}): "
                        "install Debian's chromium and chromium-driver packages")
        pytest.skip("no headless Chromium here (apt-get install chromium chromium-driver)")
    port = free_port()
    driver_process = subprocess.Popen([CHROMEDRIVER, f"--port={port}"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2)
                break
            except OSError:
                time.sleep(0.1)
        driver = WebDriver(port)
        try:
            yield driver
        finally:
            driver.quit()
    finally:
        driver_process.terminate()
        driver_process.wait(timeout=30)


@pytest.mark.time_limit(180)
def test_slider_from_lock_step_to_async_raises_throughput_in_a_browser(tmp_path, browser):
    page = tmp_path / "viz.html"
    assert viz.main(str(synthetic_trace(tmp_path / "trace.json")), str(page), max_lag=3) == 0
    browser.open(page.as_uri())

    def reading():
        return (int(browser.attribute("#stats", "data-lag")), float(browser.attribute("#stats", "data-throughput")),
                float(browser.attribute("#stats", "data-gpu-busy")), browser.text("#lag-label"))

    readings = [reading()]
    for _ in range(3):
        browser.type("#lag", ARROW_RIGHT)  # a keypress on the slider, as a user would
        readings.append(reading())
    browser.screenshot(tmp_path / "viz.png")

    assert [r[0] for r in readings] == [0, 1, 2, 3], "each right-arrow moves the slider one step"
    assert readings[0][3] == "0 (lock step)"
    assert browser.text("#measured-ratio"), "the measured ratio (or how to measure it) sits beside the replay"
    # Lock step replays the measured schedule: 12 steps of 0.21 s generation + 0.22 s training.
    lock_step_throughput = 12 * 32 / (12 * (0.01 + 0.2 + 0.2 + 0.02))
    assert abs(readings[0][1] - lock_step_throughput) / lock_step_throughput < 0.02, readings[0]
    throughputs, gpu_busy = [r[1] for r in readings], [r[2] for r in readings]
    assert throughputs[1] > throughputs[0] * 1.3, f"max lag 1 overlaps generation and training: {throughputs}"
    assert all(b >= a - 1e-9 for a, b in zip(throughputs, throughputs[1:])), f"never slower: {throughputs}"
    assert gpu_busy[1] > gpu_busy[0] + 0.2, f"idle gaps shrink: {gpu_busy}"
    assert (tmp_path / "viz.png").stat().st_size > 10_000, "a screenshot of the page"


def test_the_page_goes_where_git_ignores_it_unless_out_says_otherwise(tmp_path, monkeypatch):
    page = tmp_path / ".koans" / "viz.html"
    monkeypatch.setattr(viz, "DEFAULT_PAGE", page)
    assert viz.main(str(synthetic_trace(tmp_path / "trace.json"))) == 0
    assert page.is_file(), "with no --out, the page is written to .koans/viz.html"
    assert viz.DEFAULT_PAGE.parent.name == ".koans"
    ignored = (viz.PROJECT_ROOT / ".gitignore").read_text().split()
    assert ".koans/" in ignored, "the default page's folder is ignored by git, so it never lands in a commit"
