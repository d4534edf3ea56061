// The variant contract. A variant is one implementation of one piece of DeepSeek math, registered by one
// line next to its definition:
//
//   DSLAB_REGISTER_VARIANT(MlaCdCpu, "mla/cd/cpu", dslab::Device::cpu, "CacheDecompressed: cached K/V, plain MHA");
//
// The harness constructs variants cheaply to ask what they support and cost, then calls prepare() (untimed),
// run() (the only timed call) and verify() (against variants/reference on the same inputs).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/point.h"

namespace dslab {

enum class Device { cpu, cuda };
const char* device_name(Device d);

// A model as the harness sees it: a resolved config.json, not yet interpreted (that is the variants' job).
struct ModelFile {
  std::string name;  // file stem
  std::string path;
  nlohmann::json config;
  // A Hugging Face checkpoint folder (dslab run --weights) whose config.json this is: variants that read weights
  // (Variant::reads_weights) take theirs from it; empty: deterministic random weights from the seed.
  std::string weights;
};

struct Support {
  bool ok = true;
  std::string reason;  // why not, in the user's terms: "needs AMX", "kv cache 48 GiB exceeds memory"
  static Support no(std::string why) { return {false, std::move(why)}; }
};

// Analytic work of one run(): what the algorithm must compute and move, not what an implementation happens to.
struct Cost {
  double flops = 0;
  double bytes = 0;  // weights + caches + activations read and written, each once
};

struct Verification {
  double rel_err = 0;    // ||out - ref|| / ||ref||
  double threshold = 0;  // fp32 1e-5, bf16 1e-2
  bool pass() const { return rel_err <= threshold; }
};

// A tensor for --dump (safetensors dtype names: "BF16", "F32", "F64", "I32").
struct DumpTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

class Variant {
 public:
  virtual ~Variant() = default;
  // Axes this variant reads with their defaults, in the order they appear in result names. An empty
  // default leaves the axis out of the point unless a sweep sets it (the model's own value applies).
  virtual std::vector<std::pair<std::string, std::string>> axes() const = 0;
  // Whether this machine can run it at all ("needs AMX"); device presence is the harness's check.
  virtual Support available() const { return {}; }
  // Whether it takes its weights from ModelFile::weights (a checkpoint) when given; the others are skipped there.
  virtual bool reads_weights() const { return false; }
  // Whether it can run this point; may throw BadInput for an invalid model config.
  virtual Support supports(const ModelFile& model, const Point& point) const = 0;
  virtual Cost cost(const ModelFile& model, const Point& point) const = 0;
  // Host memory prepare() will hold (an estimate): the harness prepares the variants of a point together
  // only while their sum fits, so interleaving never runs a machine out of memory.
  virtual double host_memory_bytes(const ModelFile&, const Point&) const { return 0; }
  // GPU memory prepare() will hold (an estimate, counting shared buffers once per variant): the same rule
  // for the GPU, so a point's GPU variants are prepared together only while they fit beside each other.
  virtual double device_memory_bytes(const ModelFile&, const Point&) const { return 0; }
  // Machine-file ceiling its arithmetic runs on (e.g. "cpu.amx_bf16_flops").
  virtual std::string compute_ceiling() const = 0;
  // The machine-file key of the bandwidth its bytes move at; "" for its device's memory (CPU DRAM, GPU HBM).
  virtual std::string bandwidth_ceiling() const { return ""; }

  virtual void prepare(const ModelFile& model, const Point& point, uint64_t seed) = 0;
  // Host memory a cold sample must find in DRAM (e.g. the weights a step streams): before each sample (unless --hot;
  // a GPU variant's too, e.g. experts a GPU step runs on the CPU) the harness evicts these lines from every cache
  // level. The LLC sweep alone is not enough for a working set read again every sample: the LLC's replacement resists
  // scans and kept up to a third of a 352 MB expert set resident on the lent Xeons (the MoE engine then "streamed" 1.5x
  // the DRAM probe). Valid after prepare().
  virtual std::vector<std::pair<const void*, size_t>> cold_buffers() const { return {}; }
  virtual void run() = 0;
  // A variant that times itself (a peer in a process of its own, whose work dslab's timers cannot see): the seconds
  // its last run() took by its own clock, which the harness takes instead of its own; nullopt for every other.
  virtual std::optional<double> own_time_s() const { return std::nullopt; }
  virtual Verification verify() = 0;
  virtual std::vector<DumpTensor> tensors() const { return {}; }
  // Named facts of the prepared point that explain its time (tokens per expert, kernel choices); they
  // travel into the results entry as "counters". Called after timing; it may run the step again to measure
  // its parts (the GPU forms time each op).
  virtual std::map<std::string, double> counters() { return {}; }
  // What verify() measured besides its verdict (e.g. a sparse op's error against dense attention), as counters.
  virtual std::map<std::string, double> verification_counters() const { return {}; }
};

struct VariantEntry {
  std::string name;  // family/algorithm/backend
  Device device;
  std::string summary;
  std::function<std::unique_ptr<Variant>()> make;
};

// A GPU variant's answer for a point needing `bytes` of device memory: no GPU, too little memory (85% of it is
// the limit: the CUDA context and libraries take the rest), or yes.
Support gpu_fits(double bytes);

bool register_variant(VariantEntry entry);
const std::vector<VariantEntry>& registered_variants();  // sorted by name
const VariantEntry* find_variant(const std::string& name);

}  // namespace dslab

#define DSLAB_REGISTER_VARIANT(Class, name, device, summary)              \
  static const bool dslab_registered_##Class = ::dslab::register_variant( \
      {name, device, summary, [] { return std::unique_ptr<::dslab::Variant>(new Class()); }})
