#include "harness/tuning.h"

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "harness/errors.h"
#include "harness/host.h"
#include "harness/results.h"

namespace dslab {

TuningCache::Mode TuningCache::parse_mode(const char* text) {
  const std::string t = text ? text : "";
  if (t.empty() || t == "on") return Mode::on;
  if (t == "off") return Mode::off;
  if (t == "redo") return Mode::redo;
  throw BadInput("environment: DSLAB_TUNE '" + t + "': expected on, off or redo");
}

TuningCache& TuningCache::instance() {
  static TuningCache cache = [] {
    const GpuInfo& g = gpu_info();
    std::string device = g.present ? g.name + " driver " + std::to_string(g.driver_version) : "no GPU";
    std::string path;
    if (const char* env = std::getenv("DSLAB_TUNING_CACHE")) {
      path = env;
    } else {
      std::string slug;
      for (char c : device) slug += std::isalnum(static_cast<unsigned char>(c)) ? char(std::tolower(c)) : '-';
      const char* home = std::getenv("HOME");
      path = std::string(home ? home : ".") + "/.cache/dslab/tuning/" + slug + ".json";
    }
    return TuningCache(path, device, parse_mode(std::getenv("DSLAB_TUNE")));
  }();
  return cache;
}

TuningCache::TuningCache(std::string path, std::string device, Mode mode)
    : path_(std::move(path)), device_(std::move(device)), mode_(mode), entries_(nlohmann::json::object()) {
  std::ifstream f(path_);
  if (!f || mode_ == Mode::redo) return;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception&) {
    j = nullptr;
  }
  if (!j.is_object() || !j.contains("entries") || !j.at("entries").is_object())
    throw BadInput(path_ +
                   ": malformed tuning cache (expected {\"device\": ..., \"entries\": {...}}; delete it, or "
                   "run with DSLAB_TUNE=redo)");
  entries_ = j.at("entries");
}

std::optional<nlohmann::json> TuningCache::lookup(const std::string& family, const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (mode_ == Mode::off) return std::nullopt;
  const auto u = used_.find({family, key});
  if (u != used_.end() && u->second.second == "measured") return u->second.first;  // (measured by this run: any mode)
  if (mode_ == Mode::redo) return std::nullopt;
  const auto f = entries_.find(family);
  if (f == entries_.end() || !f->is_object()) return std::nullopt;
  const auto v = f->find(key);
  if (v == f->end()) return std::nullopt;
  used_[{family, key}] = {*v, "cache"};
  return *v;
}

void TuningCache::record(const std::string& family, const std::string& key, const nlohmann::json& value) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (mode_ == Mode::off) return;
  entries_[family][key] = value;
  used_[{family, key}] = {value, "measured"};
  save();
}

void TuningCache::use_default(const std::string& family, const std::string& key, const nlohmann::json& value) {
  std::lock_guard<std::mutex> lock(mutex_);
  used_.emplace(std::make_pair(family, key), std::make_pair(value, std::string("default")));
}

void TuningCache::save() const {
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path());
  write_json_atomically(path_, {{"device", device_}, {"entries", entries_}});
}

nlohmann::json TuningCache::report() const {
  std::lock_guard<std::mutex> lock(mutex_);
  nlohmann::json used = nlohmann::json::array();
  for (const auto& [k, v] : used_)
    used.push_back({{"family", k.first}, {"key", k.second}, {"value", v.first}, {"source", v.second}});
  const char* names[] = {"on", "off", "redo"};
  return {{"mode", names[int(mode_)]}, {"cache", path_}, {"device", device_}, {"used", used}};
}

}  // namespace dslab
