#include "harness/team_thread.h"

#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>

namespace dslab {
namespace {

class TeamThread {
 public:
  static TeamThread& instance() {
    static TeamThread t;
    return t;
  }
  void run(const std::function<void()>& f) {
    if (std::this_thread::get_id() == thread_.get_id()) return f();
    std::lock_guard<std::mutex> turn(callers_);
    job_ = &f;
    error_ = nullptr;
    const uint64_t target = posted_.fetch_add(1, std::memory_order_release) + 1;
    posted_.notify_one();
    // The caller (a CUDA host function in the hybrid step) has nothing else to do: it sleeps until the job is done.
    for (uint64_t d; (d = done_.load(std::memory_order_acquire)) != target;) done_.wait(d, std::memory_order_acquire);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  TeamThread() : thread_([this] { loop(); }) {}
  ~TeamThread() {
    stop_.store(true);
    posted_.fetch_add(1, std::memory_order_release);
    posted_.notify_one();
    thread_.join();
  }
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      // A short spin first: in a decode step the next layer's call comes within a fraction of a millisecond.
      uint64_t p = posted_.load(std::memory_order_acquire);
      for (int spin = 0; p == seen && spin < 20000; ++spin) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
        p = posted_.load(std::memory_order_acquire);
      }
      while (p == seen) {
        posted_.wait(p, std::memory_order_acquire);
        p = posted_.load(std::memory_order_acquire);
      }
      seen = p;
      if (stop_.load()) return;
      try {
        (*job_)();
      } catch (...) {
        error_ = std::current_exception();
      }
      done_.store(seen, std::memory_order_release);
      done_.notify_all();
    }
  }

  std::mutex callers_;
  const std::function<void()>* job_ = nullptr;
  std::exception_ptr error_;
  std::atomic<uint64_t> posted_{0}, done_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace

void run_on_team_thread(const std::function<void()>& f) { TeamThread::instance().run(f); }

}  // namespace dslab
