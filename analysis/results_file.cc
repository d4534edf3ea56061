#include "analysis/results_file.h"

#include <lzma.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>

#include "harness/errors.h"
#include "analysis/stats.h"

namespace dslab::reports {

namespace {
double to_us(double v, const std::string& unit) {
  if (unit == "ns") return v * 1e-3;
  if (unit == "ms") return v * 1e3;
  if (unit == "s") return v * 1e6;
  return v;
}
// The file's text; a name ending in .xz is decompressed (committed device results are kept xz-compressed: what a
// device call carries is capped, and those files are most of it).
std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw BadInput(path + ": cannot open results file");
  std::string raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (path.size() < 3 || path.compare(path.size() - 3, 3, ".xz") != 0) return raw;
  lzma_stream z = LZMA_STREAM_INIT;
  if (lzma_stream_decoder(&z, UINT64_MAX, 0) != LZMA_OK)
    throw std::runtime_error(path + ": cannot start the xz decoder");
  std::string out;
  char buffer[1 << 16];
  z.next_in = reinterpret_cast<const uint8_t*>(raw.data());
  z.avail_in = raw.size();
  lzma_ret r = LZMA_OK;
  while (r == LZMA_OK) {
    z.next_out = reinterpret_cast<uint8_t*>(buffer);
    z.avail_out = sizeof(buffer);
    r = lzma_code(&z, LZMA_FINISH);
    out.append(buffer, sizeof(buffer) - z.avail_out);
  }
  lzma_end(&z);
  if (r != LZMA_STREAM_END) throw BadInput(path + ": not a valid xz file (lzma error " + std::to_string(int(r)) + ")");
  return out;
}
}  // namespace

ResultsFile load_results(const std::string& path) {
  const std::string text = read_text(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    std::string msg = e.what();
    throw BadInput(path + ": malformed JSON (" + msg.substr(msg.find(']') + 2) + ")");
  }
  if (!j.is_object() || !j.contains("benchmarks") || !j["benchmarks"].is_array())
    throw bad_field(path, "benchmarks",
                    j.is_object() && j.contains("benchmarks") ? j["benchmarks"].dump().substr(0, 40) : "(missing)",
                    "an array (Google Benchmark JSON, as dslab run writes)");
  ResultsFile r;
  r.path = path;
  r.context = j.value("context", nlohmann::json::object());
  r.skipped = j.value("skipped", nlohmann::json::array());
  std::map<std::string, size_t> first_of;       // entry key -> index in r.entries
  std::vector<std::vector<int>> repetition_of;  // per entry: its repetition indices, sorted
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
    e.repetition_medians_us = {e.median_us};
    e.raw = b;
    const int repetition = b.value("repetition_index", 0);
    const auto seen = first_of.find(e.key());
    if (seen == first_of.end()) {
      first_of[e.key()] = r.entries.size();
      repetition_of.push_back({repetition});
      r.entries.push_back(std::move(e));
      continue;
    }
    // Another repetition of a run already read: its samples and its median join the first entry's.
    Entry& into = r.entries[seen->second];
    std::vector<int>& order = repetition_of[seen->second];
    if (std::find(order.begin(), order.end(), repetition) != order.end())
      throw bad_field(where, "repetition_index", std::to_string(repetition),
                      "a repetition index not already used by " + into.name + " (two runs of one point in one file)");
    into.samples_us.insert(into.samples_us.end(), e.samples_us.begin(), e.samples_us.end());
    const auto at = std::upper_bound(order.begin(), order.end(), repetition) - order.begin();
    order.insert(order.begin() + at, repetition);
    into.repetition_medians_us.insert(into.repetition_medians_us.begin() + at, e.median_us);
    into.median_us = stats::median(into.repetition_medians_us);
  }
  return r;
}

}  // namespace dslab::reports
