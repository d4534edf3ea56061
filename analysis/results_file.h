// Reading results.json files back (ours, or any Google Benchmark JSON with the fields we need).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dslab::reports {

struct Entry {
  std::string name, variant, model, suite, device;
  nlohmann::json axes;                        // object
  std::vector<double> samples_us;             // sample_times, or the one real_time (of every repetition, concatenated)
  double median_us = 0;                       // the median, or with repetitions the median of the repetitions' medians
  std::vector<double> repetition_medians_us;  // each repetition's median in repetition_index order (one: a single run)
  nlohmann::json raw;                         // the whole entry, for fields a report prints
  // One run of one point: variant + axes (+ model), within its suite (two suites of one sweep that share a point
  // each measure it; their runs are two entries, not repetitions of one)
  std::string key() const { return suite + "|" + variant + "|" + model + "|" + axes.dump(); }
};

struct ResultsFile {
  std::string path;
  nlohmann::json context;
  std::vector<Entry> entries;
  nlohmann::json skipped;
};

// BadInput (file, field, what was expected) when the file is missing, malformed or not benchmark JSON. The
// repetitions of one run (dslab run --repetitions) become one Entry; aggregate entries are skipped.
ResultsFile load_results(const std::string& path);

}  // namespace dslab::reports
