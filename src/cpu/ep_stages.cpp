// The CPU backend's EP stages: host memory, so copies are memcpy and the movement is the
// plain loops of ep_dispatch.cpp and ep_combine.cpp.
#include "cpu/ep_stages.h"

#include <cstring>

#include "core/ep_plan.h"
#include "cpu/ep_combine.h"
#include "cpu/ep_dispatch.h"

namespace moekit::cpu {
namespace {

class CpuEpStages final : public core::EpStages {
 public:
  void to_device(void* dst, const void* src, std::size_t bytes, Stream) const override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void to_host(void* dst, const void* src, std::size_t bytes, Stream) const override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  bool capturing(Stream) const override { return false; }
  void plan_fixed(const core::EpPlanArgs& args, Stream) const override { core::plan_fixed_on_host(args); }
  void pack(const core::EpRecordLayout& layout, const core::EpPackArgs& args, Stream) const override {
    pack_records(layout, args);
  }
  void unpack(const core::EpRecordLayout& layout, const core::EpUnpackArgs& args, Stream) const override {
    unpack_records(layout, args);
  }
  void gather_rows(const core::EpGatherArgs& args, Stream) const override { gather_expert_rows(args); }
  void sum_rows(const core::EpSumArgs& args, Stream) const override { sum_token_rows(args); }
};

}  // namespace

std::unique_ptr<core::EpStages> make_ep_stages() { return std::make_unique<CpuEpStages>(); }

}  // namespace moekit::cpu
