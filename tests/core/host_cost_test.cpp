// The host work of a forward (issue #31): the checks every call makes build no message unless they
// fail, and a layer works out what a T needs once. Counted as heap allocations of this thread (a
// deterministic stand-in for host time): each message built was a few, ~300 per forward in all.
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>
#include <string>

#include "core/stages.h"
#include "core/validate.h"
#include "moekit/moekit.h"

// The sanitizers bring their own operator new: there the counts are not taken.
#if defined(__SANITIZE_ADDRESS__)
#define MOEKIT_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MOEKIT_TEST_SANITIZED 1
#endif
#endif

#if !defined(MOEKIT_TEST_SANITIZED)
namespace {
thread_local bool counting = false;
thread_local long allocations = 0;

void* allocate(std::size_t n) {
  if (counting) ++allocations;
  return std::malloc(n ? n : 1);
}
}  // namespace

void* operator new(std::size_t n) {
  if (void* p = allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
#endif

namespace moekit::core {
namespace {

#if defined(MOEKIT_TEST_SANITIZED)
constexpr bool kCounted = false;
#else
constexpr bool kCounted = true;
#endif

// Heap allocations made by this thread while f runs (-1 where they are not counted).
template <class F>
long allocations_of(F&& f) {
#if defined(MOEKIT_TEST_SANITIZED)
  (void)f;
  return -1;
#else
  allocations = 0;
  counting = true;
  f();
  counting = false;
  return allocations;
#endif
}

MoEConfig small_config() {
  MoEConfig c;
  c.num_experts = 8;
  c.hidden_size = 128;
  c.intermediate_size = 128;
  c.routing.top_k = 2;
  return c;
}

TEST(CoreHostCost, RequireMakesItsMessageOnlyWhenTheCheckFails) {
  if (!kCounted) GTEST_SKIP() << "allocations are counted by replacing operator new, which the sanitizers own";
  int made = 0;
  const long n = allocations_of([&] {
    require(true, [&] { return ++made, std::string(100, 'x'); });
    require(true, "a literal message longer than the small-string buffer");
  });
  EXPECT_EQ(n, 0);
  EXPECT_EQ(made, 0);
  EXPECT_THROW(require(false, [&] { return ++made, std::string("named"); }), Error);
  EXPECT_EQ(made, 1);
}

TEST(CoreHostCost, CheckingAForwardsTensorsAndCarvingItsBuffersAllocateNothing) {
  if (!kCounted) GTEST_SKIP() << "allocations are counted by replacing operator new, which the sanitizers own";
  const MoEConfig c = small_config();
  const std::int64_t t = 4;
  // Views over no memory: the checks read shapes, dtypes and pointers, never the data.
  char byte = 0;
  auto view = [&](DType d, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(&byte, d, shape);
  };
  const FusedArgs fused{view(DType::bf16, {t, 128}), view(DType::f32, {t, 8}), view(DType::bf16, {t, 128}),
                        view(DType::i32, {t, 2}), view(DType::f32, {t, 2})};
  EXPECT_EQ(allocations_of([&] { EXPECT_EQ(check_args(c, fused, Device::cpu), t); }), 0);
  Carver carver(nullptr);
  EXPECT_EQ(allocations_of([&] { carver.tensor(DType::bf16, {t, 128}, Device::cpu); }), 0);
}

// A forward of a small CPU layer at T = 0 runs every check, the layer's sizes and carving and each
// stage's entry: what is left to allocate is the CPU stages' own bookkeeping.
TEST(CoreHostCost, AForwardMakesFewAllocations) {
  if (!kCounted) GTEST_SKIP() << "allocations are counted by replacing operator new, which the sanitizers own";
  const MoEConfig c = small_config();
  Tensor w13(DType::bf16, {8, 256, 128}), w2(DType::bf16, {8, 128, 128});
  LayerOptions options;
  options.max_tokens = 64;
  const Layer layer(c, {w13.view(), w2.view(), {}, {}, {}, {}, {}}, options);
  Tensor hidden(DType::bf16, {0, 128}), logits(DType::f32, {0, 8}), out(DType::bf16, {0, 128});
  Tensor workspace(DType::u8, {std::int64_t(layer.workspace_size(64)) + 256});
  const auto base = reinterpret_cast<std::uintptr_t>(workspace.view().data);
  const moekit::Workspace ws{reinterpret_cast<void*>((base + 255) / 256 * 256), layer.workspace_size(64)};
  const FusedArgs args{hidden.view(), logits.view(), out.view(), {}, {}};
  layer.forward(args, ws, nullptr);  // the first call of a T works out its sizes
  const long n = allocations_of([&] { layer.forward(args, ws, nullptr); });
  EXPECT_LE(n, 12) << "a check building its message on every call?";
}

}  // namespace
}  // namespace moekit::core
