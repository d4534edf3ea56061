// Large, read-mostly host buffers in 2 MB pages where the kernel allows it. Transparent huge pages in `madvise`
// mode (the device hosts' setting) give them only to regions that ask. The CPU experts' packed weights are the
// case: a KTransformers-style decode step streams every MoE layer's experts from DRAM (28.8 GB for V2-Lite), and in
// 4 KB pages each 4 KB of the stream needs a page-table walk whose entries the stream itself keeps evicting.
// DSLAB_HUGE_PAGES=off leaves them in 4 KB pages (to measure the difference in one run).
#pragma once
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

namespace dslab {

inline bool huge_pages_wanted() {
  static const bool wanted = [] {
    const char* v = std::getenv("DSLAB_HUGE_PAGES");
    return !(v && std::strcmp(v, "off") == 0);
  }();
  return wanted;
}

template <class T>
struct HugePageAllocator {
  using value_type = T;
  static constexpr size_t kPage = size_t(2) << 20;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) {}
  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    void* p = nullptr;
    if (bytes >= kPage / 2) {  // (smaller ones would waste most of a page)
      p = std::aligned_alloc(kPage, (bytes + kPage - 1) / kPage * kPage);
      if (p && huge_pages_wanted()) madvise(p, (bytes + kPage - 1) / kPage * kPage, MADV_HUGEPAGE);  // a hint: no error if refused
    } else {
      p = std::malloc(bytes ? bytes : 1);
    }
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const HugePageAllocator<U>&) const { return false; }
};

}  // namespace dslab
