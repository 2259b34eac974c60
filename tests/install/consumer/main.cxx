// The C++ API (kdtree.hpp) from an installed kdtree: RAII, exceptions, and one
// kernel compiled through the installed library (embedded templates + NVRTC).
// Usage: consumer_cpp CACHE_DIR
#include <kdtree/kdtree.hpp>

#include <cstdio>
#include <string>
#include <utility>

#define EXPECT(cond)                                                 \
  do {                                                               \
    if (!(cond)) {                                                   \
      std::fprintf(stderr, "consumer_cpp: %s failed\n", #cond);     \
      return 1;                                                      \
    }                                                                \
  } while (0)

int main(int argc, char** argv) {
  const std::string cache_dir = argc > 1 ? argv[1] : "";
  try {
    kdtree::Runtime offline = kdtree::Runtime::offline(90, cache_dir);
    EXPECT(offline.arch() == 90);
    offline.warm(kdtree::gqa_spec(/*head_dim=*/64, /*num_q_heads=*/8, /*num_kv_heads=*/1, /*page_size=*/16,
                                  /*max_tree_nodes=*/16));

    kdtree::Runtime moved = std::move(offline);
    EXPECT(!offline && moved && moved.handle() != nullptr);

    bool threw = false;
    try {
      moved.verify_attention(kdtree_verify_args{});
    } catch (const kdtree::Exception& e) {
      threw = e.status() != KDTREE_OK && std::string(e.what()).size() > 0;
    }
    EXPECT(threw);

    // A device runtime is created without touching the driver; binding needs one.
    kdtree::Runtime device = kdtree::Runtime::create(0, cache_dir);
    try {
      device.bind_context();
      std::printf("consumer_cpp: bound device 0 (sm_%d)\n", device.arch());
    } catch (const kdtree::Exception& e) {
      EXPECT(e.status() == KDTREE_ERROR_NO_DRIVER || e.status() == KDTREE_ERROR_NO_DEVICE ||
             e.status() == KDTREE_ERROR_DRIVER);
      std::printf("consumer_cpp: no GPU (%s)\n", e.what());
    }
  } catch (const kdtree::Exception& e) {
    std::fprintf(stderr, "consumer_cpp: unexpected kdtree error %d: %s\n", static_cast<int>(e.status()), e.what());
    return 1;
  }
  std::printf("consumer_cpp: kdtree %s\n", kdtree::version().c_str());
  return 0;
}
