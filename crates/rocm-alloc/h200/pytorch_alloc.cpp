// PyTorch's native CUDA caching allocator timed from C++ (raw_alloc / raw_delete), with the same
// patterns, sizes, loop counts and random sequence as examples/h200_compare.rs.
// Prints RESULT,<impl>,<pattern>,<value>,<unit> lines. Usage: pytorch_alloc [iterations] [runs]

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace alloc = c10::cuda::CUDACachingAllocator;

namespace {

double now_ns() {
  return std::chrono::duration<double, std::nano>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// xorshift64*, identical to the Rust harness's generator.
struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1DULL;
  }
  uint64_t size() {
    uint64_t exp = 9 + next() % 18;
    uint64_t base = 1ULL << exp;
    return base + next() % base;
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const long iters = argc > 1 ? std::atol(argv[1]) : 200000;
  const int runs = argc > 2 ? std::atoi(argv[2]) : 7;
  alloc::init(c10::cuda::device_count());

  const struct {
    const char* name;
    size_t size;
  } sizes[] = {{"4KiB", 4096}, {"1MiB", 1 << 20}, {"64MiB", size_t(64) << 20}};
  for (const auto& sz : sizes) {
    alloc::raw_delete(alloc::raw_alloc(sz.size));
    std::vector<double> t;
    for (int r = 0; r < runs; ++r) {
      double t0 = now_ns();
      for (long i = 0; i < iters; ++i) {
        void* p = alloc::raw_alloc(sz.size);
        alloc::raw_delete(p);
      }
      t.push_back((now_ns() - t0) / iters);
    }
    std::printf("RESULT,pytorch,hit_raw_%s,%.1f,ns/pair\n", sz.name, median(t));
  }

  auto segments = [] { return alloc::getDeviceStats(0).segment[0].allocated; };
  auto peak_reserved = [] { return alloc::getDeviceStats(0).reserved_bytes[0].peak; };
  const auto before = segments();
  Rng rng{0x9E3779B97F4A7C15ULL};
  std::vector<void*> live(256, nullptr);
  auto pass = [&](long n) {
    for (long i = 0; i < n; ++i) {
      size_t slot = rng.next() % 256;
      if (live[slot]) alloc::raw_delete(live[slot]);
      live[slot] = alloc::raw_alloc(rng.size());
    }
  };
  pass(iters);
  const auto warm = segments();
  std::vector<double> t;
  for (int r = 0; r < runs; ++r) {
    double t0 = now_ns();
    pass(iters);
    t.push_back((now_ns() - t0) / iters);
  }
  std::printf("RESULT,pytorch,churn_window256,%.1f,ns/op\n", median(t));
  std::printf("RESULT,pytorch,churn_device_allocs_timed,%lld,count\n", (long long)(segments() - warm));
  std::printf("RESULT,pytorch,churn_device_allocs_warmup,%lld,count\n", (long long)(warm - before));
  std::printf("RESULT,pytorch,churn_peak_reserved_MiB,%lld,MiB\n", (long long)(peak_reserved() >> 20));
  for (void* p : live)
    if (p) alloc::raw_delete(p);
  return 0;
}
