#include "reports/compare.h"

#include <cmath>
#include <cstdio>
#include <map>

#include "harness/command.h"
#include "harness/errors.h"
#include "reports/stats.h"

namespace dslab::reports {

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::faster: return "FASTER";
    case Verdict::slower: return "SLOWER";
    case Verdict::same: return "SAME";
    default: return "NOISY";
  }
}

bool CompareReport::regression() const {
  for (const auto& r : rows)
    if (r.verdict == Verdict::slower) return true;
  return false;
}

Verdict decide(double ratio, double p_value, const CompareOptions& o) {
  const bool beyond = std::fabs(ratio - 1) > o.threshold;
  if (!beyond) return Verdict::same;  // whatever the test says, smaller than we care about
  if (p_value >= o.alpha) return Verdict::noisy;  // large but not distinguishable from noise
  return ratio > 1 ? Verdict::slower : Verdict::faster;
}

namespace {

// key -> samples, divided by the normalizing variant's median at the same point when asked.
std::map<std::string, std::pair<const Entry*, std::vector<double>>> prepared(const ResultsFile& f, const CompareOptions& o,
                                                                           std::vector<std::string>& unmatched) {
  std::map<std::string, std::pair<const Entry*, std::vector<double>>> out;
  std::map<std::string, double> reference;  // model|axes -> median of the normalizing variant
  if (!o.normalize.empty())
    for (const auto& e : f.entries)
      if (e.variant == o.normalize) reference[e.model + "|" + e.axes.dump()] = stats::median(e.samples_us);
  for (const auto& e : f.entries) {
    std::vector<double> s = e.samples_us;
    if (!o.normalize.empty()) {
      if (e.variant == o.normalize) continue;  // 1 by construction
      const auto it = reference.find(e.model + "|" + e.axes.dump());
      if (it == reference.end()) {
        unmatched.push_back(e.name + " (no " + o.normalize + " at this point in " + f.path + ")");
        continue;
      }
      for (auto& v : s) v /= it->second;
    }
    out[e.key()] = {&e, s};
  }
  return out;
}

}  // namespace

CompareReport compare(const ResultsFile& base, const ResultsFile& next, const CompareOptions& o) {
  CompareReport rep;
  if (!o.normalize.empty()) {
    bool found = false;
    for (const auto& e : base.entries) found |= e.variant == o.normalize;
    if (!found) throw BadInput(base.path + ": --normalize " + o.normalize + ": no run of that variant (expected a variant in both files)");
  }
  const auto b = prepared(base, o, rep.unmatched), n = prepared(next, o, rep.unmatched);
  std::vector<double> ratios;
  for (const auto& [key, be] : b) {
    const auto it = n.find(key);
    if (it == n.end()) {
      rep.unmatched.push_back(be.first->name + " (only in " + base.path + ")");
      continue;
    }
    Comparison c;
    // variant/model/axes (results older than the model in the name get it put in place).
    const Entry& e = *be.first;
    const std::string prefix = e.variant + "/";
    c.name = e.model.empty() || e.name.rfind(prefix + e.model + "/", 0) == 0 || e.name.rfind(prefix, 0) != 0
                 ? e.name
                 : prefix + e.model + "/" + e.name.substr(prefix.size());
    c.base_median = stats::median(be.second);
    c.new_median = stats::median(it->second.second);
    c.ratio = c.new_median / c.base_median;
    c.p_value = stats::mann_whitney_u(be.second, it->second.second).p_value;
    c.verdict = decide(c.ratio, c.p_value, o);
    ratios.push_back(c.ratio);
    rep.rows.push_back(c);
  }
  for (const auto& [key, ne] : n)
    if (!b.count(key)) rep.unmatched.push_back(ne.first->name + " (only in " + next.path + ")");
  rep.geomean_ratio = stats::geomean(ratios);
  return rep;
}

namespace {

const char* kCompareHelp = R"(usage: dslab compare BASE.json NEW.json [options]

Matches runs by variant, model and axes; for each: the median ratio NEW/BASE, a two-sided Mann-Whitney
U test on the samples, and a verdict:
  SLOWER / FASTER  the ratio is beyond the threshold and the test says it is real (p < alpha)
  SAME             the ratio is within the threshold
  NOISY            the ratio is beyond the threshold but the samples cannot tell (p >= alpha)
then the geometric mean of the ratios.

options:
  --threshold F      relative change that counts (default 0.05)
  --alpha F          significance level (default 0.05)
  --normalize VAR    divide each run by VAR's median at the same point in the same file first
                     (the trustworthy mode on shared machines: ratios measured in one run)
  --strict           a CPU/GPU model mismatch between the files is an error, not a warning

exit status: 1 if any run is SLOWER, 0 otherwise, 2 on bad input.
)";

std::string machine_of(const nlohmann::json& ctx) {
  std::string s = ctx.value("cpu_model", "?");
  if (ctx.contains("gpu_name") && ctx["gpu_name"].is_string()) s += " + " + ctx["gpu_name"].get<std::string>();
  return s;
}

int cmd_compare(int argc, char** argv) {
  const Args a = parse_args(argc, argv, 2, {"--strict"}, {"--threshold", "--alpha", "--normalize"});
  if (a.positional.size() != 2) throw BadInput("command line: expected BASE.json NEW.json (see dslab compare --help)");
  CompareOptions o;
  o.threshold = a.number("--threshold", o.threshold, 0);
  o.alpha = a.number("--alpha", o.alpha, 0);
  o.normalize = a.one("--normalize");
  const ResultsFile base = load_results(a.positional[0]), next = load_results(a.positional[1]);
  const std::string mb = machine_of(base.context), mn = machine_of(next.context);
  if (mb != mn) {
    const std::string msg = "machines differ: '" + mb + "' (" + base.path + ") vs '" + mn + "' (" + next.path + ")";
    if (a.has("--strict")) throw BadInput(msg + " (--strict)");
    std::fprintf(stderr, "warning: %s\n", msg.c_str());
  }
  const CompareReport rep = compare(base, next, o);
  std::printf("%-64s %12s %12s %8s %9s  %s\n", "run", o.normalize.empty() ? "base (us)" : "base (norm)",
              o.normalize.empty() ? "new (us)" : "new (norm)", "ratio", "p", "verdict");
  int counts[4] = {};
  for (const auto& r : rep.rows) {
    std::printf("%-64s %12.4g %12.4g %8.3f %9.2g  %s\n", r.name.c_str(), r.base_median, r.new_median, r.ratio, r.p_value,
                verdict_name(r.verdict));
    ++counts[int(r.verdict)];
  }
  std::printf("%-64s %12s %12s %8.3f\n", "geomean", "", "", rep.geomean_ratio);
  std::printf("%d FASTER, %d SLOWER, %d SAME, %d NOISY (threshold %.0f%%, alpha %.2g%s)\n", counts[0], counts[1], counts[2],
              counts[3], o.threshold * 100, o.alpha, o.normalize.empty() ? "" : (", normalized by " + o.normalize).c_str());
  for (const auto& u : rep.unmatched) std::printf("unmatched: %s\n", u.c_str());
  if (rep.rows.empty()) throw BadInput(base.path + " and " + next.path + ": no run matches by variant, model and axes");
  return rep.regression() ? 1 : 0;
}

}  // namespace

DSLAB_REGISTER_COMMAND(compare, "compare", "compare two results files: ratios, U test, FASTER/SLOWER/SAME/NOISY", kCompareHelp,
                       cmd_compare);

}  // namespace dslab::reports
