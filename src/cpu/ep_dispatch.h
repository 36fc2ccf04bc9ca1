// EP dispatch on the CPU: this rank's prepared rows into records, records into rows.
#pragma once

#include "core/ep_stages.h"

namespace moekit::cpu {

void pack_records(const core::EpRecordLayout& layout, const core::EpPackArgs& args);
void unpack_records(const core::EpRecordLayout& layout, const core::EpUnpackArgs& args);

}  // namespace moekit::cpu
