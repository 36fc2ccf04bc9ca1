// The CPU backend's EP stages (DESIGN §7).
#pragma once

#include <memory>

#include "core/ep_stages.h"

namespace moekit::cpu {

std::unique_ptr<core::EpStages> make_ep_stages();

}  // namespace moekit::cpu
