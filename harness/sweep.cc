#include "harness/sweep.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "harness/build_info.h"
#include "harness/errors.h"
#include "harness/host.h"

namespace dslab {
namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const std::string& path, const std::string& what) {
  std::ifstream f(path);
  if (!f) throw BadInput(path + ": cannot open " + what);
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::parse_error& e) {
    std::string msg = e.what();
    throw BadInput(path + ": malformed JSON (" + msg.substr(msg.find(']') + 2) + ")");
  }
}

std::vector<AxisValue> axis_values_from_json(const std::string& axis, const nlohmann::json& v,
                                             const std::string& where) {
  if (v.is_string()) return parse_axis_values(axis, v.get<std::string>(), where);
  if (v.is_number_integer()) return parse_axis_values(axis, std::to_string(v.get<int64_t>()), where);
  if (v.is_array() && !v.empty()) {
    std::string spec;
    for (const auto& item : v) {
      if (!item.is_string() && !item.is_number_integer())
        throw bad_field(where, axis, v.dump(), "an array of integers or strings");
      spec += (spec.empty() ? "" : ",") +
              (item.is_string() ? item.get<std::string>() : std::to_string(item.get<int64_t>()));
    }
    return parse_axis_values(axis, spec, where);
  }
  throw bad_field(where, axis, v.dump(), "a non-empty array, an integer, or a string like \"pow2:9:14\"");
}

const VariantEntry& require_variant(const std::string& name, const std::string& where) {
  if (const VariantEntry* e = find_variant(name)) return *e;
  std::string names;
  for (const auto& v : registered_variants()) names += (names.empty() ? "" : ", ") + v.name;
  throw BadInput(where + ": variant '" + name + "': unknown variant (expected one of " + names + "; see `dslab list`)");
}

}  // namespace

Sweep parse_sweep(const nlohmann::json& j, const std::string& source, const std::string& default_name) {
  if (!j.is_object()) throw BadInput(source + ": expected a JSON object with \"suites\"");
  for (const auto& item : j.items())
    if (item.key() != "name" && item.key() != "model" && item.key() != "suites" && item.key() != "description")
      throw BadInput(source + ": field '" + item.key() +
                     "': unknown sweep field (expected name, description, model, suites)");
  Sweep s;
  s.source = source;
  s.name = j.value("name", default_name);
  const std::string model = j.contains("model") ? j["model"].get<std::string>() : "";
  if (!j.contains("suites") || !j["suites"].is_array() || j["suites"].empty())
    throw bad_field(source, "suites", j.contains("suites") ? j["suites"].dump() : "(missing)",
                    "a non-empty array of suites");
  for (size_t i = 0; i < j["suites"].size(); ++i) {
    const auto& js = j["suites"][i];
    const std::string where = source + ": suites[" + std::to_string(i) + "]";
    if (!js.is_object()) throw BadInput(where + ": expected an object");
    for (const auto& item : js.items())
      if (item.key() != "name" && item.key() != "model" && item.key() != "variants" && item.key() != "axes" &&
          item.key() != "min_samples" && item.key() != "timeout" && item.key() != "max_spread" &&
          item.key() != "unverified")
        throw BadInput(where + ": field '" + item.key() +
                       "': unknown suite field (expected name, model, variants, axes, min_samples, timeout, "
                       "max_spread, unverified)");
    Suite suite;
    suite.name = js.value("name", "suite" + std::to_string(i));
    suite.model = js.contains("model") ? js["model"].get<std::string>() : model;
    if (suite.model.empty())
      throw bad_field(where, "model", "(missing)", "a model name or path, here or at the top level");
    if (!js.contains("variants") || !js["variants"].is_array() || js["variants"].empty())
      throw bad_field(where, "variants", js.contains("variants") ? js["variants"].dump() : "(missing)",
                      "a non-empty array of variant names");
    for (const auto& v : js["variants"]) {
      if (!v.is_string()) throw bad_field(where, "variants", v.dump(), "a variant name string");
      require_variant(v.get<std::string>(), where);
      suite.variants.push_back(v.get<std::string>());
    }
    if (js.contains("min_samples")) {
      const auto& v = js["min_samples"];
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 10000)
        throw bad_field(where, "min_samples", v.dump(), "an integer 1..10000 (samples each point takes at least)");
      suite.min_samples = int(v.get<int64_t>());
    }
    if (js.contains("timeout")) {
      const auto& v = js["timeout"];
      if (!v.is_number() || v.get<double>() <= 0 || v.get<double>() > 3600)
        throw bad_field(where, "timeout", v.dump(), "seconds per point, above 0 and at most 3600");
      suite.timeout_s = v.get<double>();
    }
    if (js.contains("max_spread")) {
      const auto& v = js["max_spread"];
      if (!v.is_number() || v.get<double>() <= 0 || v.get<double>() > 10)
        throw bad_field(
            where, "max_spread", v.dump(),
            "a fraction above 0 (e.g. 0.25: a point whose p10-p90 spans more of its median is sampled again)");
      suite.max_spread = v.get<double>();
    }
    if (js.contains("unverified")) {
      const auto& v = js["unverified"];
      if (!v.is_string() || v.get<std::string>().size() < 10)
        throw bad_field(where, "unverified", v.dump(), "why this suite's points are not verified (a sentence)");
      suite.unverified_reason = v.get<std::string>();
    }
    if (js.contains("axes")) {
      if (!js["axes"].is_object()) throw bad_field(where, "axes", js["axes"].dump(), "an object of axis: values");
      for (const auto& item : js["axes"].items())
        suite.axes.push_back({item.key(), axis_values_from_json(item.key(), item.value(), where + ".axes")});
    }
    s.suites.push_back(std::move(suite));
  }
  return s;
}

Sweep load_sweep(const std::string& path) {
  return parse_sweep(read_json(path, "sweep file"), path, fs::path(path).stem().string());
}

Sweep adhoc_sweep(const std::string& model, const std::vector<std::string>& variants) {
  if (model.empty())
    throw BadInput("command line: --model: missing (expected a model name such as deepseek-v2, or a sweep file)");
  if (variants.empty())
    throw BadInput("command line: --variant: missing (expected at least one variant; see `dslab list`)");
  for (const auto& v : variants) require_variant(v, "command line");
  Suite suite;
  suite.name = "adhoc";
  suite.model = model;
  suite.variants = variants;
  return Sweep{"adhoc", "command line", {suite}};
}

void apply_axis_override(Sweep& sweep, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw BadInput("command line: --axis '" + assignment +
                   "': expected NAME=VALUES, e.g. kv_len=pow2:9:14 or batch=1,8");
  const std::string name = assignment.substr(0, eq);
  const auto values = parse_axis_values(name, assignment.substr(eq + 1), "command line --axis");
  for (auto& suite : sweep.suites) {
    bool replaced = false;
    for (auto& a : suite.axes)
      if (a.name == name) {
        a.values = values;
        replaced = true;
      }
    if (!replaced) suite.axes.push_back({name, values});
  }
}

void restrict_variants(Sweep& sweep, const std::vector<std::string>& variants) {
  if (variants.empty()) return;
  for (const auto& v : variants) require_variant(v, "command line");
  std::vector<Suite> kept;
  for (auto& suite : sweep.suites) {
    std::vector<std::string> keep;
    for (const auto& v : suite.variants)
      for (const auto& want : variants)
        if (v == want) keep.push_back(v);
    if (!keep.empty()) {
      suite.variants = keep;
      kept.push_back(suite);
    }
  }
  if (kept.empty()) throw BadInput(sweep.source + ": no suite runs any of the --variant names given");
  sweep.suites = kept;
}

void restrict_suites(Sweep& sweep, const std::vector<std::string>& suites) {
  if (suites.empty()) return;
  std::vector<Suite> kept;
  std::string names;
  for (const auto& s : sweep.suites) {
    names += (names.empty() ? "" : ", ") + s.name;
    if (std::find(suites.begin(), suites.end(), s.name) != suites.end()) kept.push_back(s);
  }
  if (kept.size() != suites.size()) throw BadInput(sweep.source + ": --suite: no such suite among " + names);
  sweep.suites = kept;
}

void override_model(Sweep& sweep, const std::string& model) {
  if (model.empty()) return;
  for (auto& suite : sweep.suites) suite.model = model;
}

ModelFile load_model_file(const std::string& name_or_path) {
  const bool is_path = name_or_path.find('/') != std::string::npos || fs::path(name_or_path).extension() == ".json";
  std::string path;
  std::vector<std::string> looked;
  if (is_path) {
    path = name_or_path;
    if (!fs::exists(path))
      throw BadInput("model '" + name_or_path + "': no such file (expected a path to a config.json)");
  } else {
    std::vector<std::string> dirs = {"workloads/models"};
    if (const char* env = std::getenv("DSLAB_MODELS")) dirs.insert(dirs.begin(), env);
    dirs.push_back(std::string(DSLAB_SOURCE_DIR) + "/workloads/models");
    for (const auto& d : dirs) {
      looked.push_back(d);
      if (fs::exists(d + "/" + name_or_path + ".json")) {
        path = d + "/" + name_or_path + ".json";
        break;
      }
    }
    if (path.empty()) {
      std::set<std::string>
          found;  // (the search path may name one folder twice: the working directory's and the source's)
      for (const auto& d : dirs)
        if (fs::is_directory(d))
          for (const auto& f : fs::directory_iterator(d))
            if (f.path().extension() == ".json") found.insert(f.path().stem().string());
      std::string names;
      for (const auto& n : found) names += (names.empty() ? "" : ", ") + n;
      throw BadInput("model '" + name_or_path + "': unknown model (expected one of " +
                     (names.empty() ? "none found" : names) + ", or a path to a config.json)");
    }
  }
  return ModelFile{fs::path(path).stem().string(), path, read_json(path, "model config"), ""};
}

Plan expand(const Sweep& sweep, const std::string& weights) {
  Plan plan;
  std::map<std::string, const ModelFile*> models;
  if (!weights.empty()) {  // one model, the checkpoint's
    if (!fs::is_directory(weights))
      throw BadInput("--weights '" + weights + "': not a folder (expected a Hugging Face checkpoint folder)");
    const std::string config = (fs::path(weights) / "config.json").string();
    if (!fs::exists(config)) throw BadInput(config + ": missing (expected the checkpoint's config.json)");
    plan.models.push_back(std::make_unique<ModelFile>(load_model_file(config)));
    plan.models.back()->name = fs::path(weights).lexically_normal().filename().string();
    if (plan.models.back()->name.empty())
      plan.models.back()->name = fs::path(weights).parent_path().filename().string();
    plan.models.back()->weights = weights;
  }
  for (const auto& suite : sweep.suites) {
    if (!weights.empty()) models[suite.model] = plan.models.front().get();
    if (!models.count(suite.model)) {
      plan.models.push_back(std::make_unique<ModelFile>(load_model_file(suite.model)));
      models[suite.model] = plan.models.back().get();
    }
    const ModelFile* model = models[suite.model];
    // The suite's axes, checked against every variant; the union of declared axes fixes the point layout.
    std::vector<std::pair<const VariantEntry*, std::unique_ptr<Variant>>> vs;
    for (const auto& name : suite.variants) {
      const VariantEntry& e = require_variant(name, sweep.source);
      vs.emplace_back(&e, e.make());
      const auto declared = vs.back().second->axes();
      for (const auto& a : suite.axes) {
        bool ok = false;
        std::string names;
        for (const auto& d : declared) {
          ok |= d.first == a.name;
          names += (names.empty() ? "" : ", ") + d.first;
        }
        if (!ok)
          throw BadInput(sweep.source + ": suite '" + suite.name + "': axis '" + a.name + "' is not an axis of " +
                         name + " (expected one of " + names + ")");
      }
    }
    // Cartesian product over the suite's axes, first axis outermost.
    std::vector<std::vector<std::pair<std::string, AxisValue>>> combos(1);
    for (const auto& a : suite.axes) {
      std::vector<std::vector<std::pair<std::string, AxisValue>>> next;
      for (const auto& c : combos)
        for (const auto& v : a.values) {
          next.push_back(c);
          next.back().emplace_back(a.name, v);
        }
      combos = std::move(next);
    }
    for (const auto& combo : combos)
      for (auto& [entry, variant] : vs) {
        Point p;
        for (const auto& [axis, def] : variant->axes()) {
          bool set = false;
          for (const auto& [k, v] : combo)
            if (k == axis) p.set(axis, v), set = true;
          // An empty default means "the model decides" (heads): the axis stays out of the point.
          if (!set && !def.empty()) p.set(axis, parse_axis_values(axis, def, entry->name + " default")[0]);
        }
        Support s;
        if (entry->device == Device::cuda && !gpu_info().present) {
          variant->supports(*model, p);  // still validates the point (BadInput), though it cannot run here
          s = Support::no(gpu_info().why_absent);
        } else if (Support a = variant->available(); !a.ok) {
          s = a;
        } else {
          s = variant->supports(*model, p);  // throws BadInput on an invalid model config
          if (s.ok && !model->weights.empty() && !variant->reads_weights())
            s = Support::no("reads no checkpoint (--weights) yet: its weights are random");
        }
        plan.points.push_back({entry, suite.name, model, p, s, suite.min_samples, suite.timeout_s, suite.max_spread,
                               suite.unverified_reason});
      }
  }
  return plan;
}

}  // namespace dslab
