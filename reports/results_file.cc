#include "reports/results_file.h"

#include <fstream>

#include "harness/errors.h"
#include "reports/stats.h"

namespace dslab::reports {

namespace {
double to_us(double v, const std::string& unit) {
  if (unit == "ns") return v * 1e-3;
  if (unit == "ms") return v * 1e3;
  if (unit == "s") return v * 1e6;
  return v;
}
}  // namespace

ResultsFile load_results(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw BadInput(path + ": cannot open results file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::parse_error& e) {
    std::string msg = e.what();
    throw BadInput(path + ": malformed JSON (" + msg.substr(msg.find(']') + 2) + ")");
  }
  if (!j.is_object() || !j.contains("benchmarks") || !j["benchmarks"].is_array())
    throw bad_field(path, "benchmarks", j.is_object() && j.contains("benchmarks") ? j["benchmarks"].dump().substr(0, 40) : "(missing)",
                    "an array (Google Benchmark JSON, as dslab run writes)");
  ResultsFile r;
  r.path = path;
  r.context = j.value("context", nlohmann::json::object());
  r.skipped = j.value("skipped", nlohmann::json::array());
  for (size_t i = 0; i < j["benchmarks"].size(); ++i) {
    const auto& b = j["benchmarks"][i];
    const std::string where = path + ": benchmarks[" + std::to_string(i) + "]";
    if (!b.is_object() || !b.contains("name") || !b.contains("real_time") || !b["real_time"].is_number())
      throw BadInput(where + ": expected an object with name and real_time");
    if (b.value("run_type", "iteration") != "iteration") continue;  // GB aggregates: we compute our own
    Entry e;
    e.name = b["name"].get<std::string>();
    e.variant = b.value("variant", e.name);
    e.model = b.value("model", "");
    e.suite = b.value("suite", "");
    e.device = b.value("device", "");
    e.axes = b.value("axes", nlohmann::json::object());
    const std::string unit = b.value("time_unit", "ns");
    if (b.contains("sample_times") && b["sample_times"].is_array() && !b["sample_times"].empty()) {
      for (const auto& s : b["sample_times"]) {
        if (!s.is_number()) throw bad_field(where, "sample_times", s.dump(), "numbers");
        e.samples_us.push_back(to_us(s.get<double>(), unit));
      }
    } else {
      e.samples_us.push_back(to_us(b["real_time"].get<double>(), unit));
    }
    e.median_us = to_us(b["real_time"].get<double>(), unit);
    e.raw = b;
    r.entries.push_back(std::move(e));
  }
  return r;
}

}  // namespace dslab::reports
