#include "analysis/compare.h"

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <map>
#include <sstream>

#include "harness/command.h"
#include "harness/errors.h"
#include "analysis/stats.h"

namespace dslab::reports {

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::faster:
      return "FASTER";
    case Verdict::slower:
      return "SLOWER";
    case Verdict::same:
      return "SAME";
    default:
      return "NOISY";
  }
}

bool CompareReport::regression() const {
  for (const auto& r : rows)
    if (r.verdict == Verdict::slower) return true;
  return false;
}

Verdict decide(double ratio, double p_value, const CompareOptions& o) {
  const bool beyond = std::fabs(ratio - 1) > o.threshold;
  if (!beyond) return Verdict::same;              // whatever the test says, smaller than we care about
  if (p_value >= o.alpha) return Verdict::noisy;  // large but not distinguishable from noise
  return ratio > 1 ? Verdict::slower : Verdict::faster;
}

namespace {

// The smallest two-sided p-value the U test can give for samples of these sizes: that of two samples that do not
// overlap at all.
double smallest_p(size_t n1, size_t n2) {
  std::vector<double> a(n1), b(n2);
  for (size_t i = 0; i < n1; ++i) a[i] = double(i);
  for (size_t i = 0; i < n2; ++i) b[i] = double(n1 + i);
  return stats::mann_whitney_u(a, b).p_value;
}

struct Prepared {
  const Entry* entry = nullptr;
  std::vector<double> samples, repetition_medians;  // divided by the normalizing variant's, when asked
  bool normalizer = false;                          // a normalizing variant itself: its own times
};

std::string family_of(const std::string& variant) { return variant.substr(0, variant.find('/')); }

// The normalizing variants of --normalize A,B,...: each normalizes its own family (mla/..., moe/...); a single one
// normalizes every run.
std::vector<std::string> normalizers(const CompareOptions& o) {
  std::vector<std::string> out;
  std::stringstream list(o.normalize);
  for (std::string name; std::getline(list, name, ',');)
    if (!name.empty()) out.push_back(name);
  return out;
}

std::string normalizer_for(const std::string& variant, const std::vector<std::string>& all) {
  for (const auto& n : all)
    if (family_of(n) == family_of(variant)) return n;
  return all.size() == 1 ? all[0] : "";
}

// key -> samples and repetition medians, divided by its normalizing variant's median at the same point (per
// repetition, when both have the same repetitions) when asked. A normalizing variant keeps its own times (marked):
// compare() holds it to the wider normalizer_threshold, so a slowdown of the reference itself is not lost.
std::map<std::string, Prepared> prepared(const ResultsFile& f, const CompareOptions& o,
                                         std::vector<std::string>& unmatched) {
  std::map<std::string, Prepared> out;
  const std::vector<std::string> all = normalizers(o);
  std::map<std::string, const Entry*> reference;  // variant|model|axes -> a normalizing variant's entry
  for (const auto& e : f.entries)
    if (std::find(all.begin(), all.end(), e.variant) != all.end())
      reference[e.variant + "|" + e.model + "|" + e.axes.dump()] = &e;
  for (const auto& e : f.entries) {
    Prepared p{&e, e.samples_us, e.repetition_medians_us};
    if (!all.empty()) {
      if (std::find(all.begin(), all.end(), e.variant) != all.end()) {  // a reference: its own times
        p.normalizer = true;
        out[e.key()] = std::move(p);
        continue;
      }
      const std::string norm = normalizer_for(e.variant, all);
      const auto it = norm.empty() ? reference.end() : reference.find(norm + "|" + e.model + "|" + e.axes.dump());
      if (it == reference.end()) {
        unmatched.push_back(e.name + " (no " + (norm.empty() ? "normalizer of its family" : norm) +
                            " at this point in " + f.path + ")");
        continue;
      }
      const Entry& ref = *it->second;
      const double ref_median = stats::median(ref.samples_us);
      for (auto& v : p.samples) v /= ref_median;
      const bool paired = ref.repetition_medians_us.size() == p.repetition_medians.size();
      for (size_t i = 0; i < p.repetition_medians.size(); ++i)
        p.repetition_medians[i] /= paired ? ref.repetition_medians_us[i] : ref.median_us;
    }
    out[e.key()] = std::move(p);
  }
  return out;
}

}  // namespace

CompareReport compare(const ResultsFile& base, const ResultsFile& next, const CompareOptions& o) {
  CompareReport rep;
  for (const auto& norm : normalizers(o)) {
    bool found = false;
    for (const auto& e : base.entries) found |= e.variant == norm;
    if (!found)
      throw BadInput(base.path + ": --normalize " + norm +
                     ": no run of that variant (expected a variant in both files)");
  }
  const auto b = prepared(base, o, rep.unmatched), n = prepared(next, o, rep.unmatched);
  std::vector<double> ratios;
  for (const auto& [key, be] : b) {
    const auto it = n.find(key);
    if (it == n.end()) {
      rep.unmatched.push_back(be.entry->name + " (only in " + base.path + ")");
      continue;
    }
    Comparison c;
    // variant/model/axes (results older than the model in the name get it put in place).
    const Entry& e = *be.entry;
    const std::string prefix = e.variant + "/";
    c.name = e.model.empty() || e.name.rfind(prefix + e.model + "/", 0) == 0 || e.name.rfind(prefix, 0) != 0
                 ? e.name
                 : prefix + e.model + "/" + e.name.substr(prefix.size());
    const Prepared& nx = it->second;
    // Several repetitions on both sides: the test runs on the repetitions' medians, which carry the run-to-run
    // drift; otherwise on the samples of one run, which cannot see it (the report says so).
    // Too few repetitions for the rank test to ever reach alpha (3 against 3: its smallest p is 0.1): the ratio
    // stays the repetition medians', the test runs on all their samples pooled (CompareReport::pooled says so).
    c.repetitions = std::min(be.repetition_medians.size(), nx.repetition_medians.size());
    const bool repeated = c.repetitions >= 2;
    const bool by_repetitions =
        repeated && smallest_p(be.repetition_medians.size(), nx.repetition_medians.size()) < o.alpha;
    const std::vector<double>& bs = repeated ? be.repetition_medians : be.samples;
    const std::vector<double>& ns = repeated ? nx.repetition_medians : nx.samples;
    rep.single_runs += !repeated;
    c.pooled = repeated && !by_repetitions;
    rep.pooled += c.pooled;
    c.base_median = stats::median(bs);
    c.new_median = stats::median(ns);
    c.ratio = c.new_median / c.base_median;
    c.p_value = by_repetitions || !repeated ? stats::mann_whitney_u(bs, ns).p_value
                                            : stats::mann_whitney_u(be.samples, nx.samples).p_value;
    c.normalizer = be.normalizer;
    CompareOptions wide = o;
    wide.threshold = o.normalizer_threshold;
    c.verdict = decide(c.ratio, c.p_value, c.normalizer ? wide : o);
    ratios.push_back(c.ratio);
    rep.rows.push_back(c);
  }
  for (const auto& [key, ne] : n)
    if (!b.count(key)) rep.unmatched.push_back(ne.entry->name + " (only in " + next.path + ")");
  rep.geomean_ratio = stats::geomean(ratios);
  return rep;
}

namespace {

const char* kCompareHelp = R"(usage: dslab compare BASE.json NEW.json [options]

Matches runs by variant, model and axes; for each: the median ratio NEW/BASE, a two-sided Mann-Whitney
U test, and a verdict. The test runs on the repetitions' medians where both files have enough of them to
reach alpha (dslab run --repetitions N, N >= 4 a side: each pass's median carries the run-to-run drift); with
2-3 repetitions on the samples of all of them pooled, with one on the samples of that run, which cannot see
drift between runs (a note says which). Verdicts:
  SLOWER / FASTER  the ratio is beyond the threshold and the test says it is real (p < alpha)
  SAME             the ratio is within the threshold
  NOISY            the ratio is beyond the threshold but the samples cannot tell (p >= alpha)
then the geometric mean of the ratios.

options:
  --threshold F      relative change that counts (default 0.05)
  --alpha F          significance level (default 0.05)
  --normalize VAR    divide each run by VAR's median at the same point in the same file first
                     (the trustworthy mode on shared machines: ratios measured in one run); VAR,VAR2,...:
                     one reference per family (mla/..., moe/..., sparse/...), each dividing its own family
  --normalizer-threshold F
                     the references' own times (not normalized) are compared too, SLOWER beyond F
                     (default 1.0: twice as slow), so a slowdown of a reference itself is not hidden
  --strict           a CPU/GPU model mismatch between the files is an error, not a warning

exit status: 1 if any run is SLOWER, 0 otherwise, 2 on bad input.
)";

std::string machine_of(const nlohmann::json& ctx) {
  std::string s = ctx.value("cpu_model", "?");
  if (ctx.contains("gpu_name") && ctx["gpu_name"].is_string()) s += " + " + ctx["gpu_name"].get<std::string>();
  return s;
}

int cmd_compare(int argc, char** argv) {
  const Args a =
      parse_args(argc, argv, 2, {"--strict"}, {"--threshold", "--alpha", "--normalize", "--normalizer-threshold"});
  if (a.positional.size() != 2) throw BadInput("command line: expected BASE.json NEW.json (see dslab compare --help)");
  CompareOptions o;
  o.threshold = a.number("--threshold", o.threshold, 0);
  o.alpha = a.number("--alpha", o.alpha, 0);
  o.normalize = a.one("--normalize");
  o.normalizer_threshold = a.number("--normalizer-threshold", o.normalizer_threshold, 0);
  const ResultsFile base = load_results(a.positional[0]), next = load_results(a.positional[1]);
  const std::string mb = machine_of(base.context), mn = machine_of(next.context);
  if (mb != mn) {
    const std::string msg = "machines differ: '" + mb + "' (" + base.path + ") vs '" + mn + "' (" + next.path + ")";
    if (a.has("--strict")) throw BadInput(msg + " (--strict)");
    std::fprintf(stderr, "warning: %s\n", msg.c_str());
  }
  const CompareReport rep = compare(base, next, o);
  std::printf("%-64s %12s %12s %8s %9s %5s  %s\n", "run", o.normalize.empty() ? "base (us)" : "base (norm)",
              o.normalize.empty() ? "new (us)" : "new (norm)", "ratio", "p", "reps", "verdict");
  int counts[4] = {};
  for (const auto& r : rep.rows) {
    std::printf("%-64s %12.4g %12.4g %8.3f %9.2g %5s  %s%s\n", r.name.c_str(), r.base_median, r.new_median, r.ratio,
                r.p_value, r.repetitions >= 2 ? std::to_string(r.repetitions).c_str() : "-", verdict_name(r.verdict),
                r.normalizer ? " (reference: its own us)" : "");
    ++counts[int(r.verdict)];
  }
  std::printf("%-64s %12s %12s %8.3f\n", "geomean", "", "", rep.geomean_ratio);
  std::printf("%d FASTER, %d SLOWER, %d SAME, %d NOISY (threshold %.0f%%, alpha %.2g%s)\n", counts[0], counts[1],
              counts[2], counts[3], o.threshold * 100, o.alpha,
              o.normalize.empty() ? "" : (", normalized by " + o.normalize).c_str());
  for (const auto& u : rep.unmatched) std::printf("unmatched: %s\n", u.c_str());
  if (rep.pooled > 0)
    std::printf(
        "note: %zu of %zu runs have too few repetitions for the U test on their medians to reach alpha %.2g; "
        "their test ran on all their samples pooled (repetitions >= 4 a side test the medians)\n",
        rep.pooled, rep.rows.size(), o.alpha);
  if (rep.single_runs > 0)
    std::printf(
        "note: %zu of %zu runs compared on the samples of one run each, which cannot see run-to-run drift; "
        "dslab run --repetitions 5 gives a test on repetition medians\n",
        rep.single_runs, rep.rows.size());
  if (rep.rows.empty()) throw BadInput(base.path + " and " + next.path + ": no run matches by variant, model and axes");
  return rep.regression() ? 1 : 0;
}

}  // namespace

DSLAB_REGISTER_COMMAND(compare, "compare", "compare two results files: ratios, U test, FASTER/SLOWER/SAME/NOISY",
                       kCompareHelp, cmd_compare);

}  // namespace dslab::reports
