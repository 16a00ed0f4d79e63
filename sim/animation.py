"""A self-contained HTML animation of batch-slot occupancy, runs side by side, step by step.

One file, no server and no network: the slot grids are embedded as JSON and drawn on canvases
by a few lines of inline JavaScript (play / pause / step / scrub). Each column is one engine
step; each row a batch slot; a colour is one request, dark grey a finished request held as
padding (static batching), light grey an idle slot.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np

from sim.plots import PADDING, slot_grid


def animation_data(results: dict, max_steps: int = 400) -> dict:
    """Per run: the slot grid (slots x steps), each step's start time and useful share."""
    panels = {k: r for k, r in results.items() if r.steps}
    if not panels:
        raise ValueError("no run recorded its steps; set simulation.record_steps: true")
    width = max(max(len(s.batch) for s in r.steps) for r in panels.values())
    data = {}
    for name, res in panels.items():
        steps = [s for s in res.steps if s.replica == 0][:max_steps]
        grid = slot_grid(steps, width)
        useful = (grid >= 0).sum(axis=0)
        seen_last: dict[int, int] = {}
        for col in range(grid.shape[1]):
            for rid in grid[:, col]:
                if rid >= 0:
                    seen_last[int(rid)] = col
        ends = np.zeros(grid.shape[1] + 1, dtype=np.int64)
        for col in seen_last.values():
            ends[col + 1] += 1
        finished_by = np.cumsum(ends)[1:]
        data[name] = {
            "grid": grid.T.tolist(),  # steps x slots, so a step is one list
            "time": [round(s.start + s.duration, 6) for s in steps],
            "useful": useful.tolist(),
            "done": finished_by.tolist(),
            "slots": int(grid.shape[0]),
        }
    return data


def write_animation(results: dict, path: Path, title: str = "Static vs continuous batching",
                    max_steps: int = 400) -> Path:
    data = animation_data(results, max_steps)
    payload = json.dumps({"panels": data, "padding": PADDING}, separators=(",", ":"))
    page = TEMPLATE.replace("__TITLE__", html.escape(title)).replace("__DATA__", payload)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)
    return path


TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{font-family:system-ui,sans-serif;margin:20px;color:#222}
.panels{display:flex;gap:24px;flex-wrap:wrap}
.panel h2{font-size:16px;margin:4px 0}
canvas{border:1px solid #999;image-rendering:pixelated}
.stats{font-size:13px;color:#444;margin-top:4px}
.controls{margin:12px 0;display:flex;gap:8px;align-items:center}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}
</style></head><body>
<h1 style="font-size:20px">__TITLE__</h1>
<p>Each column is one engine step, each row a batch slot. A colour is one request;
<span style="background:#777;color:#fff">&nbsp;dark grey&nbsp;</span> is a finished request still
holding its slot as padding; <span style="background:#e6e6e6">&nbsp;light grey&nbsp;</span> is an
idle slot. Press play, or step with the buttons or the slider.</p>
<div class="controls">
<button id="play">play</button><button id="back">&#9664; step</button>
<button id="fwd">step &#9654;</button>
<input id="scrub" type="range" min="0" value="0" style="width:420px">
<span id="stepno"></span>
<label>speed <select id="speed"><option value="1">1 step/frame</option>
<option value="4" selected>4 steps/frame</option><option value="16">16 steps/frame</option></select></label>
</div>
<div class="panels" id="panels"></div>
<script>
const DATA = __DATA__;
const PAD = DATA.padding;
const names = Object.keys(DATA.panels);
const maxSteps = Math.max(...names.map(n => DATA.panels[n].grid.length));
const cell = Math.max(2, Math.min(8, Math.floor(900 / maxSteps)));
const rowH = Math.max(4, Math.min(14, Math.floor(360 / Math.max(...names.map(n => DATA.panels[n].slots)))));
const views = names.map(name => {
  const p = DATA.panels[name];
  const div = document.createElement("div"); div.className = "panel";
  const h = document.createElement("h2"); h.textContent = name;
  const c = document.createElement("canvas");
  c.width = maxSteps * cell; c.height = p.slots * rowH;
  const s = document.createElement("div"); s.className = "stats";
  div.append(h, c, s); document.getElementById("panels").append(div);
  return {name, p, ctx: c.getContext("2d"), stats: s, canvas: c};
});
function colour(id) {
  if (id === PAD) return "#777";
  if (id < 0) return "#e6e6e6";
  return "hsl(" + ((id * 137.508) % 360) + ",65%," + (45 + (id % 3) * 10) + "%)";
}
let step = 0, playing = false;
const scrub = document.getElementById("scrub"); scrub.max = maxSteps;
function draw() {
  for (const v of views) {
    const {p, ctx} = v;
    ctx.fillStyle = "#fafafa"; ctx.fillRect(0, 0, v.canvas.width, v.canvas.height);
    const upto = Math.min(step, p.grid.length);
    let useful = 0, total = 0;
    for (let t = 0; t < upto; t++) {
      const col = p.grid[t];
      for (let s = 0; s < p.slots; s++) {
        ctx.fillStyle = colour(col[s]); ctx.fillRect(t * cell, s * rowH, cell, rowH - 1);
      }
      useful += p.useful[t]; total += p.slots;
    }
    const time = upto > 0 ? p.time[upto - 1].toFixed(3) : "0.000";
    const share = total ? (100 * useful / total).toFixed(0) : "0";
    const done = upto > 0 ? p.done[upto - 1] : 0;
    v.stats.textContent = "step " + upto + " / " + p.grid.length + " · simulated time " + time +
      " s · " + share + "% of slot-steps useful · " + done + " requests done";
  }
  scrub.value = step; document.getElementById("stepno").textContent = "step " + step + " / " + maxSteps;
}
function tick() {
  if (!playing) return;
  step = Math.min(maxSteps, step + parseInt(document.getElementById("speed").value));
  draw();
  if (step >= maxSteps) { playing = false; document.getElementById("play").textContent = "play"; return; }
  requestAnimationFrame(tick);
}
document.getElementById("play").onclick = () => {
  playing = !playing; if (step >= maxSteps) step = 0;
  document.getElementById("play").textContent = playing ? "pause" : "play"; if (playing) tick();
};
document.getElementById("fwd").onclick = () => { step = Math.min(maxSteps, step + 1); draw(); };
document.getElementById("back").onclick = () => { step = Math.max(0, step - 1); draw(); };
scrub.oninput = () => { step = parseInt(scrub.value); draw(); };
draw();
</script></body></html>
"""
