"""
How busy a long run's progress keeps the page, and how fast it still answers (2026-12-04).

Run: ``.venv/bin/python benchmarks/page_progress.py [--seconds 120] [--slower 3]`` (Chromium from
``make browser``; not in ``make bench``).

The page is served in-process on a CPU worker and driven by Playwright: RISE alone on the Text
tab, 200,000 masks in batches of ``--batch``, each batch followed by a sleep of ``--pace``
seconds, so the cores stay free and only the page's own work is measured. ``--slower`` slows
the browser's CPU (Chrome's throttling) to stand for a loaded machine. Every ``--every``
seconds a row: the time a trivial script (``() => 1``) takes to answer, the page's main thread
busy time per second since the last row (Chrome's ``TaskDuration``) and the steps the bar shows.
A page that keeps up answers in milliseconds throughout; one that falls behind answers later
and later.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch
from _browser import ARGS, CHROMIUM
from _live_server import launch_blocks
from _tables import print_table
from playwright.sync_api import CDPSession, expect, sync_playwright

from attrlab.app.ui import build_ui
from attrlab.app.worker import ExplainWorker
from attrlab.attribution.inputs.perturb import BatchRunner

#: The steps the run's progress shows ("1,234/200,000 steps"); null if none.
STEPS = """
() => {
  const shown = [...document.querySelectorAll('.progress-level-inner, .progress-text, .meta-text')]
    .map((e) => e.textContent.match(/([\\d,]+)\\/[\\d,]+ steps/)).find((m) => m);
  return shown ? Number(shown[1].replaceAll(',', '')) : null;
}
"""


def pace(seconds: float) -> None:
    """Sleep ``seconds`` after each batch of every batched method."""
    step = BatchRunner._step

    def paced(self: BatchRunner) -> None:
        step(self)
        if self.done:
            time.sleep(seconds)

    BatchRunner._step = paced  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--seconds", type=float, default=120, help="how long to watch the run")
    parser.add_argument("--every", type=float, default=10, help="seconds between rows")
    parser.add_argument("--slower", type=float, default=1, help="the browser's CPU slowed by")
    parser.add_argument("--batch", type=int, default=4, help="RISE's batch size")
    parser.add_argument("--pace", type=float, default=0.2, help="sleep after each batch (s)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pace(args.pace)
    worker = ExplainWorker(device="cpu")
    demo = build_ui(worker)
    rows: list[list[object]] = []
    try:
        url = launch_blocks(demo)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(600_000)
            page.goto(url)
            expect(page.locator("#text-run")).to_be_visible(timeout=120_000)
            methods = page.locator("#text-methods")
            methods.get_by_label("integrated_gradients", exact=True).uncheck()
            methods.get_by_label("attnlrp", exact=True).uncheck()
            methods.get_by_label("rise", exact=True).check()
            page.locator("#text-params-rise").get_by_text("Parameters", exact=False).first.click()
            for name, value in {"n_masks": 200_000, "batch_size": args.batch}.items():
                field = page.locator(f"#text-param-rise-{name}").locator("input, textarea")
                field.click(click_count=3)
                field.type(str(value))
                field.press("Tab")
            cost = page.locator("#text-cost")
            expect(cost).to_contain_text("200,001 forward", timeout=300_000)
            chrome = page.context.new_cdp_session(page)
            chrome.send("Performance.enable")
            chrome.send("Emulation.setCPUThrottlingRate", {"rate": args.slower})
            page.locator("#text-run").click()
            page.wait_for_function(f"() => ({STEPS})() !== null", timeout=300_000)
            started = time.monotonic()
            busy, then = _busy(chrome), started
            while time.monotonic() - started < args.seconds:
                asked = time.monotonic()
                page.evaluate("() => 1")
                answered = time.monotonic()
                now_busy = _busy(chrome)
                rate = (now_busy - busy) / max(answered - then, 1e-9)
                busy, then = now_busy, answered
                rows.append(
                    [
                        f"{asked - started:.0f}",
                        f"{answered - asked:.3f}",
                        f"{rate:.2f}",
                        f"{page.evaluate(STEPS):,}",
                    ]
                )
                print(*rows[-1], flush=True)
                time.sleep(args.every)
            browser.close()
    finally:
        demo.close()
        worker.close()
    print(f"\nCPU slowed {args.slower:g}×, batches of {args.batch}, {args.pace} s after each\n")
    print_table(["s into the run", "script answers (s)", "busy (s per s)", "steps shown"], rows)


def _busy(chrome: CDPSession) -> float:
    """Seconds the page's main thread has spent in tasks so far."""
    metrics = chrome.send("Performance.getMetrics")["metrics"]
    return next(float(m["value"]) for m in metrics if m["name"] == "TaskDuration")


if __name__ == "__main__":
    main()
