"""The HTML backend map: readable (WCAG AA contrast for every cell and key), escaped, and laid
out to fit a 1366 px window; checked in a real headless browser where one is installed."""

from __future__ import annotations

import os
import shutil
from html.parser import HTMLParser

import pytest

from commsim.backends import backends
from commsim.report.contrast import AA_NORMAL_TEXT, contrast, readable_on
from commsim.report.sweep_map import render
from commsim.scenario.sweep import run_sweep, select_ids


@pytest.fixture(scope="module")
def report():
    rep = run_sweep(select_ids(count=30, seed=5), jobs=1)
    # A record as a tampered shard could carry it: merged reports print shard strings.
    rep.records[0] = dict(rep.records[0], ok=False, kinds=["numerics"],
                          description="<script>alert(1)</script>", failures=[],
                          replay="commsim replay s3-1; rm -rf ~ <b>")
    return rep


class _Styles(HTMLParser):
    """(background, colour) of every element with an inline style giving both."""

    def __init__(self) -> None:
        super().__init__()
        self.pairs: list[tuple[str, str, str]] = []
        self.scripts = 0

    def handle_starttag(self, tag, attrs):
        self.scripts += tag == "script"
        style = dict(attrs).get("style") or ""
        decl = dict(p.split(":", 1) for p in style.split(";") if ":" in p)
        if "background" in decl and "color" in decl:
            self.pairs.append((tag, decl["background"].strip(), decl["color"].strip()))


def test_the_contrast_formula_matches_wcag_examples():
    assert contrast("#000000", "#ffffff") == pytest.approx(21.0)
    assert contrast("#777777", "#ffffff") == pytest.approx(4.48, abs=0.01)   # the classic just-fail grey
    assert contrast("#767676", "#ffffff") >= AA_NORMAL_TEXT


@pytest.mark.parametrize("name", sorted(backends()))
def test_every_backend_colour_gets_readable_text(name):
    bg, fg = readable_on(backends()[name].colour)
    assert contrast(bg, fg) >= AA_NORMAL_TEXT


def test_every_cell_and_key_meets_aa_and_shard_text_is_escaped(report):
    page = render(report)
    p = _Styles()
    p.feed(page)
    cells = [x for x in p.pairs if x[0] == "div"]
    assert len(cells) >= 5 and any(x[0] == "span" for x in p.pairs)
    low = [(bg, fg, round(contrast(bg, fg), 2)) for _, bg, fg in p.pairs
           if contrast(bg, fg) < AA_NORMAL_TEXT]
    assert not low, low
    assert p.scripts == 0 and "&lt;script&gt;" in page and "rm -rf ~ &lt;b&gt;" in page
    assert "opacity" not in page          # blending a colour into white is what failed AA


def _browser() -> tuple[object, str]:
    """A headless Chromium driven by selenium, or the reason there is none."""
    try:
        from selenium import webdriver
    except ImportError:
        return None, "selenium is not installed (pip install selenium)"
    binary = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    driver = next((d for d in ("chromedriver", "chromium-driver") if shutil.which(d)), None)
    if binary is None or driver is None:
        return None, "no chromium with chromium-driver on PATH (apt install chromium chromium-driver)"
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which(binary)
    for a in ("--headless=new", "--no-sandbox", "--window-size=1366,768", "--disable-gpu"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(shutil.which(driver)), options=opts), ""


_MEASURE = """
function rgb(s) { return s.match(/\\d+(\\.\\d+)?/g).slice(0, 3).map(Number); }
function lum(c) { return 0.2126 * lin(c[0]) + 0.7152 * lin(c[1]) + 0.0722 * lin(c[2]); }
function lin(v) { v /= 255; return v <= 0.04045 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); }
const low = [], cut = [];
for (const el of document.querySelectorAll('.cell:not(.empty), .h, .key')) {
  const cs = getComputedStyle(el);
  const a = lum(rgb(cs.color)), b = lum(rgb(cs.backgroundColor));
  const r = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
  if (r < 4.5) low.push([el.textContent, r]);
  if (el.scrollWidth > el.clientWidth + 1) cut.push(el.textContent);
}
return {width: document.documentElement.scrollWidth, view: window.innerWidth, low: low, cut: cut};
"""


def test_in_a_headless_browser_it_fits_1366_px_and_every_cell_is_readable(tmp_path):
    browser, why = _browser()
    if browser is None:
        pytest.skip(why)
    page = tmp_path / "map.html"
    # Enough scenarios for every group layout the generator makes: the hand-built page of
    # before was 1441 px wide at full size and cut 5 labels at this one.
    page.write_text(render(run_sweep(select_ids(count=300, seed=5), jobs=1)))
    try:
        browser.get(page.as_uri())
        got = browser.execute_script(_MEASURE)
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        browser.quit()
    assert got["width"] <= got["view"] <= 1366, got
    assert not got["low"], got["low"]
    assert not got["cut"], got["cut"]
    assert not errors, errors
