#!/usr/bin/env python3
"""Comparison plots from dslab results files.

usage: scripts/plot.py [RESULTS.json ...] --out DIR [--baseline VARIANT] [--offload OFFLOAD.json] [--plan PLAN.json ...]

Per suite: latency against the swept axis, one line per variant (log axes for power-of-two axes), one
panel per combination of the other axes; speedup bars against the baseline variant (default: the
suite's first). Per device: a roofline chart with the calibrated roofs from the run's machine file and
each (variant, point) placed by arithmetic intensity and achieved FLOP/s. With --offload (from `dslab
offload`): the placement chart, each op by arithmetic intensity and CPU time / GPU time, coloured by
where it was placed. With --plan (from `dslab plan`): the step's ops on both devices' rooflines, and the
placements' predicted (and, where run, measured) step times. Each figure as PNG and SVG.
Exit status 2 on bad input.
"""
import argparse
import lzma
import json
import math
import os
import sys
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

AXIS_PREFERENCE = ["kv_len", "tokens", "batch", "q_len", "heads", "page_size", "threads", "experts", "topk"]


def fail(msg):
    print(f"plot.py: {msg}", file=sys.stderr)
    sys.exit(2)


def read_json(path):
    try:
        # (committed device results are kept xz-compressed)
        with (lzma.open(path, "rt") if path.endswith(".xz") else open(path)) as f:
            return json.load(f)
    except OSError as e:
        fail(f"{path}: cannot open ({e.strerror})")
    except lzma.LZMAError as e:
        fail(f"{path}: not a valid xz file ({e})")
    except json.JSONDecodeError as e:
        fail(f"{path}: malformed JSON ({e.msg} at line {e.lineno})")


def load(path):
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        fail(f"{path}: field 'benchmarks': missing: expected dslab results (Google Benchmark JSON)")
    for i, b in enumerate(data["benchmarks"]):
        if b.get("run_type", "iteration") != "iteration":
            continue
        for field in ("variant", "axes", "real_time"):
            if field not in b:
                fail(f"{path}: benchmarks[{i}]: field '{field}': missing: expected a dslab results entry")
    data["benchmarks"] = one_entry_per_run(data["benchmarks"])
    return data


def one_entry_per_run(benchmarks):
    """Drops Google Benchmark aggregates; the repetitions of one run (dslab run --repetitions) become one entry
    whose real_time is the median of the passes' medians (the other fields: the first pass's). A run is a suite's
    point: one point in two suites (a variant measured beside others in each) is two runs."""
    runs = OrderedDict()
    for b in benchmarks:
        if b.get("run_type", "iteration") == "iteration":
            runs.setdefault((b.get("suite", ""), b["name"]), []).append(b)
    merged = []
    for passes in runs.values():
        b = dict(passes[0])
        if len(passes) > 1:
            times = sorted(p["real_time"] for p in passes)
            mid = len(times) // 2
            b["real_time"] = times[mid] if len(times) % 2 else 0.5 * (times[mid - 1] + times[mid])
        merged.append(b)
    return merged


def seconds(b, field="real_time"):
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b.get("time_unit", "ns")]
    return b[field] * scale


def is_pow2_axis(values):
    ints = [v for v in values if isinstance(v, int)]
    return len(ints) == len(values) and len(values) > 2 and all(v > 0 and v & (v - 1) == 0 for v in ints)


def save(fig, out, stem):
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out, f"{stem}.{ext}"), dpi=130, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {os.path.join(out, stem)}.png/.svg")


def suites(data):
    groups = OrderedDict()
    for b in data["benchmarks"]:
        groups.setdefault((b.get("suite", ""), b.get("model", "")), []).append(b)
    return groups


def variant_axes(entries):
    """Axes fixed per variant that differ between variants (each variant's default executor, say): they name a
    line, not a panel or a point, so the variants still meet in one panel and in one speedup bar group."""
    per = {}
    for b in entries:
        for k, v in b["axes"].items():
            per.setdefault(k, {}).setdefault(b["variant"], set()).add(json.dumps(v))
    return {k for k, by_variant in per.items()
            if all(len(s) == 1 for s in by_variant.values()) and len(set.union(*by_variant.values())) > 1}


def series_of(b, fixed):
    return b["variant"] + "".join(f" ({k}={b['axes'][k]})" for k in sorted(fixed) if k in b["axes"])


def swept_axis(entries, fixed=frozenset()):
    values = {}
    for b in entries:
        for k, v in b["axes"].items():
            values.setdefault(k, set()).add(v)
    swept = [k for k, v in values.items() if len(v) > 1 and k not in fixed]
    if not swept:
        return None, values
    swept.sort(key=lambda k: AXIS_PREFERENCE.index(k) if k in AXIS_PREFERENCE else len(AXIS_PREFERENCE))
    return swept[0], values


def plot_latency(entries, title, out, stem):
    fixed = variant_axes(entries)
    x_axis, values = swept_axis(entries, fixed)
    variants = list(OrderedDict.fromkeys(b["variant"] for b in entries))
    def facet_of(b):
        return tuple((k, v) for k, v in sorted(b["axes"].items()) if k != x_axis and len(values[k]) > 1 and k not in fixed)
    facets = list(OrderedDict.fromkeys(facet_of(b) for b in entries))
    # One variant whose points differ by one other axis (e.g. executor eager | graph): that axis's values are the
    # lines of one panel, so they can be compared at a glance.
    series_axis = None
    facet_keys = {k for f in facets for k, _ in f}
    if len(variants) == 1 and len(facet_keys) == 1 and len(facets) <= 6:
        series_axis = facet_keys.pop()
        facets = [()]
    def in_facet(b, facet):
        return series_axis is not None or facet_of(b) == facet
    lines = [(v, s) for v in variants
             for s in (OrderedDict.fromkeys(b["axes"][series_axis] for b in entries) if series_axis else [None])]
    cols = min(3, len(facets))
    rows = math.ceil(len(facets) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    for ax, facet in zip(axes.flat, facets):
        for v, sv in lines:
            pts = sorted(((b["axes"].get(x_axis, 0), seconds(b), seconds(b, "p10_time") if "p10_time" in b else None,
                           seconds(b, "p90_time") if "p90_time" in b else None)
                          for b in entries if b["variant"] == v and in_facet(b, facet) and (sv is None or b["axes"][series_axis] == sv)),
                         key=lambda p: p[0])
            if not pts:
                continue
            xs = [p[0] for p in pts]
            ys = [p[1] * 1e3 for p in pts]
            label = series_of(next(b for b in entries if b["variant"] == v), fixed)
            ax.plot(xs, ys, marker="o", label=label if sv is None else f"{label} {series_axis}={sv}")
            if all(p[2] is not None for p in pts):
                ax.fill_between(xs, [p[2] * 1e3 for p in pts], [p[3] * 1e3 for p in pts], alpha=0.15)
        if x_axis and is_pow2_axis(sorted(values[x_axis])):
            ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(x_axis or "point")
        ax.set_ylabel("median time (ms), p10..p90 shaded")
        ax.set_title(", ".join(f"{k}={v}" for k, v in facet) or title, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(facets):]:
        ax.axis("off")
    fig.suptitle(f"{title}: latency")
    fig.tight_layout()
    save(fig, out, stem)


def shared_axes(entries):
    """The axes every variant's runs have, where the variants declare different axes (a peer that takes only the
    shape, beside a variant with launch options) and those axes still leave each variant one run a point: the points
    where they meet (as dslab report lines them up). None otherwise."""
    names = {}
    for b in entries:
        names.setdefault(b["variant"], set()).update(b["axes"])
    shared = set.intersection(*names.values()) if names else set()
    if not shared or all(n == shared for n in names.values()):
        return None
    keys = [(b["variant"], json.dumps({k: b["axes"][k] for k in shared}, sort_keys=True)) for b in entries]
    return shared if len(keys) == len(set(keys)) else None


def plot_speedup(entries, title, baseline, out, stem):
    variants = list(OrderedDict.fromkeys(b["variant"] for b in entries))
    base = baseline if baseline in variants else variants[0]
    fixed = variant_axes(entries)
    shared = shared_axes(entries)
    def point_of(b):
        return json.dumps({k: v for k, v in b["axes"].items() if k not in fixed and (shared is None or k in shared)},
                          sort_keys=True)
    points = list(OrderedDict.fromkeys(point_of(b) for b in entries))
    time = {(b["variant"], point_of(b)): seconds(b) for b in entries}
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(points) * len(variants) / 2), 4))
    width = 0.8 / len(variants)
    for i, v in enumerate(variants):
        ys = [time[(base, p)] / time[(v, p)] if (v, p) in time and (base, p) in time else 0 for p in points]
        ax.bar(np.arange(len(points)) + i * width, ys, width, label=series_of(next(b for b in entries if b["variant"] == v), fixed))
    ax.axhline(1, color="black", lw=0.8)
    ax.set_xticks(np.arange(len(points)) + 0.4 - width / 2)
    varying = {k for k in json.loads(points[0]) if len({json.dumps(json.loads(p).get(k)) for p in points}) > 1}
    ax.set_xticklabels(["\n".join(f"{k}={v}" for k, v in json.loads(p).items() if k in varying) for p in points], fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel(f"speedup vs {base} (x, log)")
    ax.set_title(f"{title}: speedup against {base}")
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    save(fig, out, stem)


def intensity_axes(ax, ylabel, title, title_size=None):
    """Log-log axes over arithmetic intensity: the roofline and placement charts share them."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=title_size)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def plot_roofline(data, device, out, stem):
    machine = data["context"].get("machine") or {}
    section = machine.get("cpu" if device == "cpu" else "gpu") or {}
    if device == "cpu":
        roofs = [(section.get("amx_bf16_flops"), "AMX bf16"), (section.get("avx512_bf16_flops"), "AVX-512 bf16")]
        bandwidth, bw_label = section.get("dram_read_bytes_per_s"), "DRAM read"
    else:
        roofs = [(section.get("tensor_bf16_flops"), "tensor bf16 (cuBLAS)")]
        bandwidth, bw_label = section.get("hbm_bytes_per_s"), "HBM"
    entries = [b for b in data["benchmarks"] if b.get("device") == device and b.get("bytes")]
    if not entries:
        return
    fig, ax = plt.subplots(figsize=(7, 5))
    ai = np.array([b["arithmetic_intensity"] for b in entries])
    lo, hi = max(min(ai) / 4, 1e-2), max(ai) * 4
    xs = np.logspace(math.log10(lo), math.log10(hi), 200)
    if bandwidth:
        for peak, label in roofs:
            if peak:
                ax.plot(xs, np.minimum(peak, xs * bandwidth), lw=1.5, label=f"{label} {peak / 1e12:.3g} TFLOP/s, {bw_label} {bandwidth / 1e9:.3g} GB/s")
    else:
        ax.text(0.02, 0.95, "no machine file: run `dslab calibrate` for roofs", transform=ax.transAxes, fontsize=8)
    for v in OrderedDict.fromkeys(b["variant"] for b in entries):
        pts = [b for b in entries if b["variant"] == v]
        ax.scatter([b["arithmetic_intensity"] for b in pts], [b["flops"] / seconds(b) for b in pts], label=v, s=22)
    name = data["context"].get("cpu_model") if device == "cpu" else data["context"].get("gpu_name")
    intensity_axes(ax, "achieved FLOP/s", f"roofline: {name}")
    save(fig, out, stem)


def plot_offload(path, out, stem):
    plan = load_offload(path)
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for device, color in (("cpu", "tab:blue"), ("gpu", "tab:green")):
        for measured, marker in ((True, "o"), (False, "^")):
            ops = [o for o in plan["ops"] if o["placement"] == device and o["cpu_time_s"] > 0 and o["gpu_time_s"] > 0
                   and o["gpu_source"].startswith("measured") == measured]
            if ops:
                ax.scatter([o["arithmetic_intensity"] for o in ops], [o["cpu_time_s"] / o["gpu_time_s"] for o in ops],
                           c=color, marker=marker, s=30,
                           label=f"placed on {device.upper()} (GPU time {'measured' if measured else 'estimated'})")
    ax.axhline(1, color="black", lw=0.8)
    for device, style in (("cpu", ":"), ("gpu", "--")):
        ridge = plan[device]["ridge_flop_per_byte"]
        if ridge:
            ax.axvline(ridge, color="gray", ls=style, lw=1, label=f"{device.upper()} ridge {ridge:.3g} FLOP/byte")
    intensity_axes(ax, "CPU time / GPU time (> 1: the GPU is faster)", f"offload placement: {plan['cpu']['name']} + {plan['gpu']['name']}", 9)
    save(fig, out, stem)


def load_offload(path):
    plan = read_json(path)
    if not isinstance(plan, dict) or not isinstance(plan.get("ops"), list):
        fail(f"{path}: field 'ops': missing: expected an offload plan from `dslab offload`")
    return plan


def load_plan(path):
    plan = read_json(path)
    if not isinstance(plan, dict) or not isinstance(plan.get("placements"), list) or not isinstance(plan.get("ops"), list):
        fail(f"{path}: field 'placements': missing: expected a plan from `dslab plan`")
    return plan


def plot_plan(path, out, stem):
    plan = load_plan(path)
    c = plan["ceilings"]
    point = plan["point"]
    where = f"{plan['model']}, {plan['phase']}, batch {point['batch']}, q_len {point['q_len']}, kv_len {point['kv_len']}"
    # The ops on both rooflines: each op (one per name) at its intensity, at the rate each device can give it.
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ops = [o for o in plan["ops"] if o["bytes"] > 0 and o["flops"] > 0]
    ai = np.array([o["intensity"] for o in ops])
    xs = np.logspace(math.log10(max(ai.min() / 4, 1e-2)), math.log10(max(ai.max() * 4, c["gpu_ridge"] * 4)), 200)
    for name, peak, bw, color in (("GPU", c["gpu_flops"], c["gpu_bytes_per_s"], "tab:green"),
                                  ("CPU", c["cpu_flops"], c["cpu_bytes_per_s"], "tab:blue")):
        ax.plot(xs, np.minimum(peak, xs * bw), color=color, lw=1.5,
                label=f"{name} {peak / 1e12:.3g} TFLOP/s, {bw / 1e9:.3g} GB/s (ridge {peak / bw:.3g})")
        ax.scatter(ai, np.minimum(peak, ai * bw), color=color, s=18)
    groups = OrderedDict()  # ops at (nearly) one intensity share one label
    for o in sorted(ops, key=lambda o: o["intensity"]):
        groups.setdefault(round(math.log10(o["intensity"]), 1), []).append(o)
    for group in groups.values():
        x = group[0]["intensity"]
        ax.annotate("\n".join(o["op"] for o in group), (x, min(c["gpu_flops"], x * c["gpu_bytes_per_s"])), fontsize=6,
                    xytext=(-4, 6), textcoords="offset points", ha="right", va="bottom")
    intensity_axes(ax, "attainable FLOP/s", f"ops of the step: {where}", 9)
    fig.tight_layout()
    save(fig, out, f"{stem}-roofline")
    # The placements: predicted step time, measured where a run exists; those that do not fit the budget hatched.
    places = plan["placements"]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(places) + 1.5))
    ys = np.arange(len(places))
    pred = [p["predicted_s"] * 1e3 for p in places]
    bars = ax.barh(ys - 0.2, pred, height=0.4, color="tab:gray")
    for bar, p in zip(bars, places):
        if not p["fits"]:
            bar.set_hatch("//")
            bar.set_alpha(0.5)
        if p["chosen"]:
            bar.set_color("tab:orange")
    for y, v in zip(ys, pred):
        ax.annotate(f"{v:.3g}", (v, y - 0.2), fontsize=6, xytext=(2, -2), textcoords="offset points")
    meas = [(y, p["measured_s"] * 1e3) for y, p in zip(ys, places) if p.get("measured_s") is not None]
    if meas:
        ax.barh([y + 0.2 for y, _ in meas], [m for _, m in meas], height=0.4, color="tab:purple")
        for y, v in meas:
            ax.annotate(f"{v:.3g}", (v, y + 0.2), fontsize=6, xytext=(2, -2), textcoords="offset points")
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color="tab:gray", label="predicted"), Patch(color="tab:orange", label="predicted, the plan's choice"),
                       Patch(color="tab:purple", label="measured")], fontsize=7)
    ax.set_yticks(ys)
    ax.set_yticklabels([p["placement"] + (" (chosen)" if p["chosen"] else "" if p["fits"] else " (does not fit)") for p in places],
                       fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("step time (ms, log)")
    ax.set_title(f"placements: {where}", fontsize=9)
    ax.grid(True, axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    save(fig, out, f"{stem}-placements")


def plot_generation(data, out, stem):
    """dslab generate's runs: TTFT, ITL and end-to-end latency CDFs, and the batch over time, a line per run."""
    runs = [b for b in data["benchmarks"] if "generation" in b]
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.5))
    for b in runs:
        g, label = b["generation"], "concurrency %d" % b.get("concurrency", 0)
        if len(runs) > len(set(b.get("concurrency") for b in runs)):  # several runs of one concurrency: axes too
            label += " " + "/".join("%s" % v for k, v in sorted(b.get("axes", {}).items()) if k == "executor")
        for ax, key, scale in ((axes[0], "ttft_s", 1e3), (axes[1], "itl_s", 1e3), (axes[2], "e2e_s", 1.0)):
            v = sorted(x * scale for x in g["series"][key])
            if v:
                ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=label)
        axes[3].plot(g["series"]["step_t_s"], g["series"]["step_decodes"], label=label, linewidth=0.8)
    for ax, title, xlabel in ((axes[0], "time to first token", "ms"), (axes[1], "inter-token latency", "ms"),
                              (axes[2], "end-to-end latency", "s")):
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("fraction of requests" if ax is not axes[1] else "fraction of gaps")
        ax.grid(alpha=0.3)
    axes[1].set_xscale("log")
    axes[3].set_title("batch occupancy: decodes per step")
    axes[3].set_xlabel("s since the first arrival")
    axes[3].grid(alpha=0.3)
    for ax in axes:
        ax.legend(fontsize=8)
    ctx = data.get("context", {})
    fig.suptitle("dslab generate: %s on %s%s" % (ctx.get("engine", "?"), ctx.get("model", "?"),
                                                 ", " + ctx["gpu_name"] if ctx.get("gpu_name") else ""))
    fig.tight_layout()
    save(fig, out, stem)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="*", help="results.json files from `dslab run`")
    p.add_argument("--out", required=True, help="folder for the PNG and SVG files")
    p.add_argument("--baseline", default="", help="variant the speedups are against (default: each suite's first)")
    p.add_argument("--offload", default="", help="an offload plan from `dslab offload`: adds the placement chart")
    p.add_argument("--plan", action="append", default=[], help="a plan.json from `dslab plan`: its ops' roofline and its placements")
    args = p.parse_args()
    if not args.results and not args.plan:
        fail("command line: nothing to plot: give results.json files and/or --plan PLAN.json")
    datasets = [load(r) for r in args.results]  # all checked before anything is written
    if datasets and all(any("generation" in b for b in d["benchmarks"]) for d in datasets):
        os.makedirs(args.out, exist_ok=True)
        for i, data in enumerate(datasets):
            plot_generation(data, args.out, "generate" + ("-%d" % i if len(datasets) > 1 else ""))
        return
    if args.offload:
        load_offload(args.offload)
    for path in args.plan:
        load_plan(path)
    os.makedirs(args.out, exist_ok=True)
    # A suite measured over several runs (extra points, re-measured points) is one chart: entries join by
    # (suite, model) across files, and a later file's entry replaces an earlier one of the same name.
    merged = OrderedDict()
    for data in datasets:
        for key, entries in suites(data).items():
            by_name = merged.setdefault(key, OrderedDict())
            for b in entries:
                by_name[b["name"]] = b
    for (suite, model), by_name in merged.items():
        entries = list(by_name.values())
        stem = f"{suite or 'suite'}-{model}".replace("/", "_")
        title = f"{suite} ({model})"
        plot_latency(entries, title, args.out, f"{stem}-latency")
        if len(set(b["variant"] for b in entries)) > 1:
            plot_speedup(entries, title, args.baseline, args.out, f"{stem}-speedup")
    for path, data in zip(args.results, datasets):
        # Several files: name their rooflines after the folder each results.json sits in.
        tag = "-" + os.path.basename(os.path.dirname(os.path.abspath(path))) if len(datasets) > 1 else ""
        for device in ("cpu", "cuda"):
            plot_roofline(data, device, args.out, f"roofline-{device}{tag}")
    if args.offload:
        plot_offload(args.offload, args.out, "offload-placement")
    for path in args.plan:
        plot_plan(path, args.out, "plan-" + os.path.basename(os.path.dirname(os.path.abspath(path))))


if __name__ == "__main__":
    main()
