// `dslab report RESULTS.json [...] --out DIR`: a Markdown report per suite.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include "harness/command.h"
#include "harness/errors.h"
#include "analysis/results_file.h"
#include "analysis/stats.h"

namespace dslab::reports {
namespace {

const char* kReportHelp = R"(usage: dslab report RESULTS.json [RESULTS.json ...] --out DIR [--baseline VARIANT]

Writes DIR/report.md: for each results file, its context (device, commit, command line, ceilings), then
per suite: median time per variant per point, speedup against the baseline variant (default: the
suite's first variant; a peer that takes fewer axes meets the variants at the axes they share),
achieved TFLOP/s and GB/s with arithmetic intensity and roofline fraction, verification error and
verdict, stop reason; whole layer steps' tokens/s, GPU/CPU time, per-op time and each op against its
floor; sparse attention beside the dense fused kernel at the same point (its attention alone, the
selection's share, the speed-ups); and the points that were skipped, with why.
Plots: scripts/plot.py RESULTS.json --out DIR.
)";

std::string num(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// A phase's us, or - where the kernel (or the dslab that wrote the results) does not record it.
std::string us_or_dash(double us) { return std::isnan(us) ? std::string("-") : num("%.2f", us); }

std::string time_str(double us) {
  if (us >= 1e6) return num("%.3g s", us * 1e-6);
  if (us >= 1e3) return num("%.3g ms", us * 1e-3);
  return num("%.3g us", us);
}

std::string axes_label(const nlohmann::json& axes) {
  std::string s;
  for (const auto& [k, v] : axes.items())
    s += (s.empty() ? "" : " ") + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
  return s;
}

// How a suite's runs line up as points of its tables: by all their axes; or, where the suite's variants declare
// different axes (a peer that takes only the shape, beside a variant with launch options), by the axes they all have,
// if that still leaves each variant one run a point - so a peer's time meets the variant's it is compared with.
std::function<std::string(const Entry&)> comparison_points(const std::vector<Entry>& entries,
                                                           const std::string& suite) {
  std::map<std::string, std::set<std::string>> names_of;  // variant -> the axes its runs have
  for (const auto& e : entries)
    if (e.suite == suite)
      for (const auto& [k, v] : e.axes.items()) names_of[e.variant].insert(k);
  std::set<std::string> shared = names_of.empty() ? std::set<std::string>{} : names_of.begin()->second;
  for (const auto& [variant, names] : names_of) {
    std::set<std::string> both;
    std::set_intersection(shared.begin(), shared.end(), names.begin(), names.end(), std::inserter(both, both.begin()));
    shared = std::move(both);
  }
  const bool differ =
      std::any_of(names_of.begin(), names_of.end(), [&](const auto& variant) { return variant.second != shared; });
  auto shared_label = [shared](const Entry& e) {
    nlohmann::json kept = nlohmann::json::object();
    for (const auto& [k, v] : e.axes.items())
      if (shared.count(k)) kept[k] = v;
    return axes_label(kept);
  };
  std::map<std::pair<std::string, std::string>, int> runs;
  bool meet = differ && !shared.empty();
  for (const auto& e : entries)
    if (e.suite == suite) meet = meet && ++runs[{e.variant, shared_label(e)}] == 1;
  if (meet) return shared_label;
  return [](const Entry& e) { return axes_label(e.axes); };
}

double counter(const Entry& e, const char* k) {
  const auto& r = e.raw;
  return r.contains("counters") && r["counters"].contains(k) && r["counters"][k].is_number()
             ? r["counters"][k].get<double>()
             : NAN;
}

// Sparse attention against dense: each sparse result's attention (kernel_s: its selection + decode + combine) and where
// it goes, beside mla/fused/cuda's at the same model, batch, q_len, kv_len and page size in the same file.
void write_sparse_against_dense(const ResultsFile& f, std::ostringstream& md) {
  std::vector<const Entry*> sparse;
  for (const Entry& e : f.entries)
    if (!std::isnan(counter(e, "selection_share"))) sparse.push_back(&e);
  if (sparse.empty()) return;
  auto same_point = [](const Entry& a, const Entry& b) {
    for (const char* k : {"batch", "q_len", "kv_len", "page_size", "kv_dtype"})
      if (a.axes.value(k, nlohmann::json()) != b.axes.value(k, nlohmann::json())) return false;
    return a.model == b.model;
  };
  md << "Sparse attention against dense mla/fused/cuda at the same point (attention = `kernel_s`: a sparse step's "
        "selection, "
        "the `op_us.select_*` stages, then its decode and combine; the step adds the projections both share):\n\n"
        "| variant | point | step | attention | of it: selection | its stages, us | dense step | dense attention | "
        "dense / sparse attention | "
        "dense / sparse step | keys attended | rel. err vs dense "
        "|\n|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|\n";
  // The attention's stages (op_us.select_*, then decode and combine), so where a selector's time goes reads off the
  // row.
  auto stages = [](const Entry& e) {
    std::string out;
    if (!e.raw.contains("counters")) return out;
    const auto& c = e.raw["counters"];
    auto add = [&](const std::string& key, const std::string& label) {
      if (c.contains(key) && c[key].is_number())
        out += (out.empty() ? "" : ", ") + label + " " + num("%.3g", c[key].get<double>());
    };
    for (const auto& [k, v] : c.items())
      if (k.rfind("op_us.select_", 0) == 0) add(k, k.substr(13));
    add("op_us.decode", "decode");
    add("op_us.combine", "combine");
    return out;
  };
  for (const Entry* e : sparse) {
    const Entry* dense = nullptr;
    for (const Entry& d : f.entries)
      if (d.variant == "mla/fused/cuda" && same_point(*e, d)) dense = &d;
    const double attention = counter(*e, "kernel_s");
    md << "| " << e->variant << " | " << axes_label(e->axes) << " | " << time_str(e->median_us) << " | "
       << time_str(attention * 1e6) << " | " << num("%.0f%%", 100 * counter(*e, "selection_share")) << " | "
       << stages(*e) << " | ";
    if (dense) {
      const double dense_attention = counter(*dense, "kernel_s");
      md << time_str(dense->median_us) << " | " << time_str(dense_attention * 1e6) << " | "
         << num("%.2fx", dense_attention / attention) << " | " << num("%.2fx", dense->median_us / e->median_us)
         << " | ";
    } else {
      md << "— | — | — | — | ";
    }
    md << num("%.0f", counter(*e, "attended_keys")) << " | " << num("%.2e", counter(*e, "rel_err_vs_dense")) << " |\n";
  }
  md << "\n";
}

void write_file(const ResultsFile& f, const std::string& baseline_opt, std::ostringstream& md) {
  const auto& c = f.context;
  md << "## " << f.path << "\n\n";
  md << "| | |\n|---|---|\n";
  md << "| CPU | " << c.value("cpu_model", "?") << " (" << c.value("num_cpus", 0) << " threads) |\n";
  if (c.contains("gpu_name") && c["gpu_name"].is_string())
    md << "| GPU | " << c["gpu_name"].get<std::string>() << " (" << c.value("gpu_sms", 0) << " SMs) "
       << c.value("gpu_uuid", "") << " |\n";
  // SM clock and throttle reasons as the run started and ended: a run that throttled says so next to its numbers.
  for (const char* when : {"gpu_clocks_before", "gpu_clocks_after"}) {
    if (!c.contains(when) || !c[when].is_object()) continue;
    const auto& k = c[when];
    if (k.contains("unavailable")) {
      md << "| " << when << " | " << k["unavailable"].get<std::string>() << " |\n";
      continue;
    }
    std::string reasons;
    if (k.contains("clock_event_reasons") && k["clock_event_reasons"].is_array())
      for (const auto& r : k["clock_event_reasons"]) reasons += (reasons.empty() ? "" : ", ") + r.get<std::string>();
    auto mhz = [&](const char* key) {
      return k.contains(key) && k[key].is_number() ? num("%.0f", k[key].get<double>()) : std::string("?");
    };
    md << "| " << when << " | SM " << mhz("sm_clock_mhz") << " of " << mhz("max_sm_clock_mhz") << " MHz, memory "
       << mhz("memory_clock_mhz") << " MHz, " << mhz("temperature_c") << " C, " << mhz("power_w")
       << " W; clock reasons: " << (reasons.empty() ? "none" : reasons) << " |\n";
  }
  md << "| commit | " << c.value("git_sha", "?") << " (" << c.value("build_type", "?") << ") |\n";
  md << "| date | " << c.value("date", "?") << " |\n";
  md << "| command | `" << c.value("command_line", "?") << "` |\n";
  if (c.contains("machine") && c["machine"].is_object()) {
    const auto& m = c["machine"];
    auto ceiling = [&](const char* sec, const char* key, double scale, const char* unit) {
      if (m.contains(sec) && m[sec].is_object() && m[sec].contains(key) && m[sec][key].is_number())
        md << "| " << sec << "." << key << " | " << num("%.3g ", m[sec][key].get<double>() * scale) << unit << " |\n";
    };
    ceiling("cpu", "amx_bf16_flops", 1e-12, "TFLOP/s");
    ceiling("cpu", "avx512_bf16_flops", 1e-12, "TFLOP/s");
    ceiling("cpu", "dram_read_bytes_per_s", 1e-9, "GB/s");
    ceiling("cpu", "dram_copy_bytes_per_s", 1e-9, "GB/s");
    ceiling("gpu", "hbm_bytes_per_s", 1e-9, "GB/s");
    ceiling("gpu", "tensor_bf16_flops", 1e-12, "TFLOP/s");
    ceiling("gpu", "launch_overhead_s", 1e6, "us");
    ceiling("gpu", "graph_launch_overhead_s", 1e6, "us");
    ceiling("gpu", "graph_kernel_node_s", 1e6, "us");
    ceiling("gpu", "small_kernel_s", 1e6, "us");
    ceiling("gpu", "h2d_pinned_bytes_per_s", 1e-9, "GB/s");
    ceiling("gpu", "d2h_pinned_bytes_per_s", 1e-9, "GB/s");
  }
  md << "\n";
  // Suites in order of appearance; within each, points and variants in order of appearance.
  std::vector<std::string> suites;
  for (const auto& e : f.entries)
    if (std::find(suites.begin(), suites.end(), e.suite) == suites.end()) suites.push_back(e.suite);
  for (const auto& suite : suites) {
    std::vector<std::string> variants, points;
    std::map<std::pair<std::string, std::string>, const Entry*> at;
    std::string model;
    const std::function<std::string(const Entry&)> point_of = comparison_points(f.entries, suite);
    for (const auto& e : f.entries) {
      if (e.suite != suite) continue;
      model = e.model;
      const std::string p = point_of(e);
      if (std::find(variants.begin(), variants.end(), e.variant) == variants.end()) variants.push_back(e.variant);
      if (std::find(points.begin(), points.end(), p) == points.end()) points.push_back(p);
      at[{e.variant, p}] = &e;
    }
    const std::string baseline =
        std::find(variants.begin(), variants.end(), baseline_opt) != variants.end() ? baseline_opt : variants.front();
    md << "### suite " << (suite.empty() ? "(unnamed)" : suite) << " — " << model << "\n\n";
    // A table with one row per point and one column per variant.
    auto variant_columns = [&](const std::string& caption) {
      md << caption << "\n\n| point |";
      for (const auto& v : variants) md << " " << v << " |";
      md << "\n|---|";
      for (size_t i = 0; i < variants.size(); ++i) md << "---:|";
      md << "\n";
    };
    variant_columns("Median time (p10..p90):");
    for (const auto& p : points) {
      md << "| " << p << " |";
      for (const auto& v : variants) {
        const auto it = at.find({v, p});
        if (it == at.end()) {
          md << " — |";
          continue;
        }
        const auto& r = it->second->raw;
        md << " " << time_str(it->second->median_us);
        if (r.contains("p10_time"))
          md << " (" << time_str(r["p10_time"].get<double>()) << ".." << time_str(r["p90_time"].get<double>()) << ")";
        md << " |";
      }
      md << "\n";
    }
    variant_columns("\nSpeedup against " + baseline + " (its time / the variant's; > 1 is faster):");
    for (const auto& p : points) {
      md << "| " << p << " |";
      const auto base = at.find({baseline, p});
      for (const auto& v : variants) {
        const auto it = at.find({v, p});
        md << " "
           << (it == at.end() || base == at.end() ? "—" : num("%.2fx", base->second->median_us / it->second->median_us))
           << " |";
      }
      md << "\n";
    }
    md << "\n| variant | point | TFLOP/s | GB/s | FLOP/byte | roofline | bound | rel. err | verify | stop | samples | "
          "counters |\n";
    md << "|---|---|---:|---:|---:|---:|---|---:|---|---|---:|---|\n";
    // f(variant, point, entry) for each run of the suite, point by point.
    auto each_run = [&](auto&& f) {
      for (const auto& p : points)
        for (const auto& v : variants)
          if (const auto it = at.find({v, p}); it != at.end()) f(v, axes_label(it->second->axes), *it->second);
    };
    each_run([&](const std::string& v, const std::string& p, const Entry& e) {
      const auto& r = e.raw;
      auto get = [&](const char* k) { return r.contains(k) && r[k].is_number() ? r[k].get<double>() : NAN; };
      const bool verified = r.contains("verify_pass") && r["verify_pass"].is_boolean();
      md << "| " << v << " | " << p << " | " << num("%.3g", get("achieved_flops_per_s") * 1e-12) << " | "
         << num("%.3g", get("achieved_bytes_per_s") * 1e-9) << " | " << num("%.3g", get("arithmetic_intensity"))
         << " | " << (r.contains("roofline_fraction") ? num("%.2f", get("roofline_fraction")) : "—") << " | "
         << r.value("roofline_bound", "—") << " | " << (verified ? num("%.2e", get("verify_rel_err")) : "—") << " | "
         << (verified                   ? (r["verify_pass"].get<bool>() ? "PASS" : "**FAIL**")
             : r.contains("unverified") ? "not verified"
                                        : "off")
         << " | " << r.value("stop_reason", "—") << (r.value("resampled", false) ? ", resampled" : "") << " | "
         << r.value("samples", 0) << " | ";
      if (r.contains("counters") && r["counters"].is_object())
        for (const auto& [k, cv] : r["counters"].items()) md << k << "=" << num("%.4g", cv.get<double>()) << " ";
      md << "|\n";
    });
    md << "\n";
    // Whole steps (layer runs): what a step delivers and where its time goes between the GPU and the CPU.
    bool steps = false;
    for (const auto& [key, e] : at)
      steps = steps || (!std::isnan(counter(*e, "tokens_per_s")) && !std::isnan(counter(*e, "kernel_time_s")));
    if (steps) {
      md << "Whole steps: tokens/s at the median; the GPU's busy time (CUPTI) and idle share of the step; the routed "
            "experts' CPU "
            "time per step (measured inside the step, where the CPU runs them); MoE layers whose experts the GPU runs; "
            "the "
            "experts streamed to the GPU per step (gpu_experts=streamed) and the link rate that makes over the "
            "step:\n\n"
            "| variant | point | step | tokens/s | GPU busy | GPU idle | CPU experts | MoE layers on the GPU | experts "
            "streamed |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---:|\n";
      each_run([&](const std::string& v, const std::string& p, const Entry& e) {
        if (std::isnan(counter(e, "kernel_time_s"))) return;
        const double cpu = counter(e, "cpu_experts_engine_s"), on_gpu = counter(e, "gpu_moe_layers"),
                     moe = counter(e, "moe_layers");
        const double streamed = counter(e, "streamed_expert_bytes");
        md << "| " << v << " | " << p << " | " << time_str(e.median_us) << " | "
           << num("%.4g", counter(e, "tokens_per_s")) << " | " << time_str(counter(e, "kernel_time_s") * 1e6) << " | "
           << num("%.0f%%", 100 * counter(e, "gpu_idle_fraction")) << " | "
           << (std::isnan(cpu) ? std::string("—") : time_str(cpu * 1e6)) << " | "
           << (std::isnan(on_gpu) ? std::string("—")
                                  : num("%.0f", on_gpu) + (std::isnan(moe) ? "" : " of " + num("%.0f", moe)))
           << " | "
           << (std::isnan(streamed)
                   ? std::string("—")
                   : num("%.1f GB", streamed / 1e9) + " at " + num("%.1f GB/s", streamed / (e.median_us * 1e-6) / 1e9))
           << " |\n";
      });
      md << "\n";
      // Where a step's time goes, op by op (the op_us.* counters), largest first: a row for each run that has them.
      std::string op_rows;
      each_run([&](const std::string& v, const std::string& p, const Entry& e) {
        if (!e.raw.contains("counters")) return;
        std::vector<std::pair<double, std::string>> op_us;
        double sum = 0;
        for (const auto& [k, cv] : e.raw["counters"].items())
          if (k.rfind("op_us.", 0) == 0 && cv.is_number())
            op_us.push_back({cv.get<double>(), k.substr(6)}), sum += cv.get<double>();
        if (op_us.empty()) return;
        std::sort(op_us.begin(), op_us.end(), [](const auto& a, const auto& b) {
          return a.first != b.first ? a.first > b.first : a.second < b.second;
        });
        op_rows += "| " + v + " | " + p + " | ";
        for (size_t i = 0; i < op_us.size(); ++i)
          op_rows += (i ? ", " : "") + op_us[i].second + " " + num("%.4g", op_us[i].first) + " (" +
                     num("%.0f%%", 100 * op_us[i].first / sum) + ")";
        op_rows += " |\n";
      });
      if (!op_rows.empty())
        md << "Per-op GPU time of a step, largest first (`op_us.*`: one eager step queued behind a blocking kernel, "
              "each op "
              "bracketed by events, so each carries its event's 1-2 us and none overlaps the next under PDL: they sum "
              "past "
              "the step's GPU busy time; the share is of their sum):\n\n"
              "| variant | point | ops, us (share) |\n|---|---|---|\n"
           << op_rows << "\n";
      // Each op against its own floor (op_floors: the cost model's ops, their bytes or FLOPs at the machine's ceilings
      // plus their kernels at a small kernel's measured time), slowest against its floor first.
      std::string floor_rows;
      each_run([&](const std::string& v, const std::string& p, const Entry& e) {
        if (!e.raw.contains("op_floors") || !e.raw["op_floors"].is_object()) return;
        std::vector<std::pair<double, std::string>> rows;  // (time over floor, cell)
        double time = 0, floor = 0;
        for (const auto& [op, f] : e.raw["op_floors"].items()) {
          const double t = f.value("time_us", 0.0), fl = f.value("floor_us", 0.0);
          time += t, floor += fl;
          rows.push_back({t - fl, op + " " + num("%.4g", t) + " / " + num("%.3g", fl) + " (" +
                                      num("%.2f", t > 0 ? fl / t : 0.0) + ")"});
        }
        std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
        floor_rows += "| " + v + " | " + p + " | " + num("%.4g", time) + " / " + num("%.4g", floor) + " (" +
                      num("%.2f", time > 0 ? floor / time : 0.0) + ") | ";
        for (size_t i = 0; i < rows.size(); ++i) floor_rows += (i ? ", " : "") + rows[i].second;
        floor_rows += " |\n";
      });
      if (!floor_rows.empty())
        md << "Each op against its own floor (`op_floors`: the op rows' bracketed us / floor us (fraction); a floor is "
              "the cost model's bytes, or FLOPs, of the op's work at the machine's measured ceilings, plus its "
              "kernels at a small kernel's measured time; ordered by time above the floor, largest first):\n\n"
              "| variant | point | all rows, us / floor (fraction) | ops |\n|---|---|---|---|\n"
           << floor_rows << "\n";
    }
    // Where the fused decode kernel's CTAs spend their time (decode_phase_us.*, mla/fused/cuda and the sparse decodes
    // built on it): a row for each run that has them.
    std::string phase_rows;
    each_run([&](const std::string& v, const std::string& p, const Entry& e) {
      if (std::isnan(counter(e, "decode_phase_us.done"))) return;
      phase_rows += "| " + v + " | " + p + " | " + num("%.0f", counter(e, "decode_phase.working_ctas")) + " | " +
                    num("%.0f", counter(e, "decode_phase.blocks"));
      for (const char* k :
           {"wait", "first_block_landed", "first_block_scored", "first_block_maxed", "first_block_handed_over",
            "first_block_accumulated", "last_block_accumulated", "done", "last_done", "per_block", "span"}) {
        const double us = counter(e, (std::string("decode_phase_us.") + k).c_str());
        phase_rows += " | " + us_or_dash(us);
      }
      phase_rows += " |\n";
    });
    if (!phase_rows.empty())
      md << "Where the fused decode kernel's CTAs spend their time (`decode_phase_us.*`: SM clocks in one more eager "
            "step, "
            "medians over the CTAs that walked keys; wait is from a CTA's start to the end of its griddepcontrol.wait, "
            "the "
            "phases are us after that (negative: copies queued before it; -: not recorded by that kernel - the "
            "128-head "
            "two-warpgroup kernel's \"their P V done\" is the end of its first pair of blocks), per block is the "
            "steady time "
            "of a further block of decode_phase.block_keys keys, span the kernel's first start to last exit; the "
            "slowest CTA's "
            "outputs written against the median's is what the CTAs' unequal pace costs):\n\n"
            "| variant | point | CTAs | blocks a CTA | wait | first keys landed | their Q K^T done | row max | P "
            "handed over | their P V done | "
            "last block's P V done | outputs written | slowest CTA's | per block | span "
            "|\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
         << phase_rows << "\n";
    // Where the 128-head kernel's CTAs walk two segments or more: what switching from the first to the second costs
    // (its phases, and the switch against the two blocks a steady pair takes).
    std::string switch_rows;
    each_run([&](const std::string& v, const std::string& p, const Entry& e) {
      const double from = counter(e, "decode_phase_us.first_segment_accumulated"),
                   to = counter(e, "decode_phase_us.second_segment_first_accumulated");
      if (std::isnan(from) || std::isnan(to)) return;
      switch_rows += "| " + v + " | " + p;
      for (const char* k : {"first_segment_last_pairs", "first_segment_last_pair", "first_segment_accumulated",
                            "first_segment_stored", "first_segment_written", "second_segment_q_landed",
                            "second_segment_scored", "second_segment_first_accumulated"})
        switch_rows += " | " + us_or_dash(counter(e, (std::string("decode_phase_us.") + k).c_str()));
      const double per_block = counter(e, "decode_phase_us.per_block");
      switch_rows += " | " + us_or_dash(from - counter(e, "decode_phase_us.first_segment_last_pairs")) + " | " +
                     num("%.2f", to - from) + " | " + us_or_dash(2 * per_block) + " |\n";
    });
    if (!switch_rows.empty())
      md << "Where a CTA of the two-warpgroup kernel walks two segments or more, what the switch costs "
            "(`decode_phase_us.*`, medians, us after griddepcontrol.wait): the first segment's last two or three "
            "blocks (after "
            "its whole pairs: its tail) entered and its last pair done, all its products done, its outputs stored (by "
            "thread "
            "0's warp) and written (by all), the second segment's Q landed, its first two blocks scored and its first "
            "pair "
            "done; the tail is the products done less the tail entered, the switch the next first pair less the "
            "products "
            "done, against two steady blocks (one pair):\n\n"
            "| variant | point | tail entered | last pair done | products done | outputs stored | outputs written | "
            "next Q landed | "
            "next scored | next first pair | tail | switch | two blocks |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
         << switch_rows << "\n";
  }
  write_sparse_against_dense(f, md);
  std::vector<const Entry*> above;  // faster than its floor: the ceilings are stale or wrong, not the kernel fast
  for (const Entry& e : f.entries)
    if (e.raw.contains("roofline_fraction") && e.raw["roofline_fraction"].is_number() &&
        e.raw["roofline_fraction"].get<double>() > 1.0)
      above.push_back(&e);
  if (!above.empty()) {
    md << "**Above the roofline** (roofline_fraction > 1.0: no kernel beats its ceiling, so a ceiling in the machine "
          "file is "
          "stale or wrong; recalibrate with `dslab calibrate`):\n\n";
    for (const Entry* e : above)
      md << "- " << e->name << " [" << e->model << "]: " << num("%.2f", e->raw["roofline_fraction"].get<double>())
         << "\n";
    md << "\n";
  }
  if (!f.skipped.empty()) {
    md << "Skipped:\n\n";
    for (const auto& s : f.skipped) md << "- " << s.value("name", "?") << ": " << s.value("reason", "?") << "\n";
    md << "\n";
  }
}

int cmd_report(int argc, char** argv) {
  const Args a = parse_args(argc, argv, 2, {}, {"--out", "--baseline"});
  if (a.positional.empty())
    throw BadInput("command line: expected at least one RESULTS.json (see dslab report --help)");
  const std::string out = a.one("--out");
  if (out.empty()) throw BadInput("command line: --out: missing (expected the folder for report.md)");
  std::vector<ResultsFile> files;
  for (const auto& p : a.positional) files.push_back(load_results(p));  // all read before anything is written
  std::ostringstream md;
  md << "# dslab report\n\n";
  for (const auto& f : files) write_file(f, a.one("--baseline"), md);
  std::filesystem::create_directories(out);
  const std::string path = out + "/report.md", tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << md.str();
    if (!f) throw std::runtime_error(tmp + ": write failed");
  }
  std::filesystem::rename(tmp, path);
  std::printf("report: %s\n", path.c_str());
  return 0;
}

}  // namespace

DSLAB_REGISTER_COMMAND(report, "report", "Markdown report of results files: times, speedups, roofline, verification",
                       kReportHelp, cmd_report);

}  // namespace dslab::reports
